"""Measured behaviour of the attention kernel that the cost model's plain roofline does not capture.

vLLM runs one varlen attention launch over the whole batch. On GPUs where that launch is
FlashAttention-2 (no FA3 below sm_90), a batch that holds a prefill chunk disables FA2's decode path:
the query heads that share a KV head are no longer packed together, so each decode row reads its K
and V once per *query* head instead of once per KV head. `data/attention_backends.csv` holds, per GPU,
a two-term fit of measured kernel times, t = per-query-head K/V bytes / rate_q + per-KV-head bytes /
rate_kv (with the source of the measurements). On FA2 GPUs with a known L2 size the cost model prices
a mixed batch's decode rows as units of the chunk's launch instead (mixed_launch.py); the rates are the
switch for that mechanism (derived_mechanisms.py) and price the decode rows elsewhere. GPUs without a
row keep the plain roofline.
"""
from __future__ import annotations

from functools import lru_cache

from ._catalog import read_catalog


@lru_cache(maxsize=1)
def _rows() -> dict[str, dict[str, str]]:
    return {row["gpu"]: row for row in read_catalog("attention_backends.csv")}


def mixed_decode_s_per_byte(gpu_name: str) -> tuple[float, float]:
    """(seconds per byte of K/V read per query head, per byte read per KV head) of a decode row in a
    mixed batch, as fitted to measured kernel times; (0, 0) where nothing was measured."""
    row = _rows().get(gpu_name)
    if row is None:
        return 0.0, 0.0
    return 1.0 / float(row["mixed_decode_q_bytes_per_s"]), 1.0 / float(row["mixed_decode_kv_bytes_per_s"])


def attention_source(gpu_name: str) -> str | None:
    row = _rows().get(gpu_name)
    return row["source"] if row else None


# -- decode imbalance: contexts of different lengths in one launch -----------------------------------
#
# The launch waits for its longest rows (tile padding, idle SMs), so a batch of decodes with mixed
# contexts costs t_mean + alpha (t_max - t_mean), t_mean / t_max = the same batch with every row at the
# mean / the longest context. `data/decode_imbalance.csv` holds alpha per GPU, regime (decodes alone,
# or beside a prefill chunk) and number of decodes, from measured kernel times
# (benchmarks/fit_decode_imbalance.py records the source); GPUs without rows get alpha = 0.
SKEW_COLUMNS = ("regime", "n", "alpha")
REGIMES = ("pure", "mixed")


def read_skew_rows(path):
    """(regime, decodes, alpha) of each measured shot of an LLMServingSim `skew.csv`, streamed; NaN or
    empty alphas (t_max <= t_mean) skipped. A malformed table raises MalformedTableError naming file and column."""
    import csv
    import math

    from .aiconfigurator_tables import MalformedTableError
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in SKEW_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise MalformedTableError(f"{path}:columns", reader.fieldnames, f"lacks columns {missing}")
        for line, raw in enumerate(reader, start=2):
            regime = raw["regime"]
            if regime not in REGIMES:
                raise MalformedTableError(f"{path}:{line}:regime", regime, f"must be one of {REGIMES}")
            try:
                n, alpha = int(raw["n"]), float(raw["alpha"] or "nan")
            except (TypeError, ValueError):
                raise MalformedTableError(f"{path}:{line}:n/alpha", (raw["n"], raw["alpha"]),
                                          "must be an integer and a number") from None
            if n < 1:
                raise MalformedTableError(f"{path}:{line}:n", n, "must be >= 1")
            if not math.isnan(alpha):
                yield regime, n, alpha


@lru_cache(maxsize=None)
def decode_imbalance(gpu_name: str) -> tuple[tuple[tuple[int, float], ...], ...] | None:
    """((decodes, alpha) points of decodes alone, of decodes beside a chunk), or None where unmeasured."""
    points: dict[str, list[tuple[int, float]]] = {r: [] for r in REGIMES}
    for row in read_catalog("decode_imbalance.csv"):
        if row["gpu"] == gpu_name:
            points[row["regime"]].append((int(row["decodes"]), float(row["alpha"])))
    if not any(points.values()):
        return None
    return tuple(tuple(sorted(points[r])) for r in REGIMES)


def imbalance_alpha(points: tuple[tuple[int, float], ...], decodes: int) -> float:
    """alpha at `decodes`: linear in log2(decodes) between measured counts, the end values beyond."""
    from bisect import bisect_left
    from math import log2
    if not points:
        return 0.0
    i = bisect_left(points, (decodes, -1.0))
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (n0, a0), (n1, a1) = points[i - 1], points[i]
    return a0 + (a1 - a0) * (log2(decodes) - log2(n0)) / (log2(n1) - log2(n0))
