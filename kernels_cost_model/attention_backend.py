"""Measured behaviour of the attention kernel that the cost model's plain roofline does not capture.

vLLM runs one varlen attention launch over the whole batch. On GPUs where that launch is
FlashAttention-2 (no FA3 below sm_90), a batch that holds a prefill chunk disables FA2's decode path:
the query heads that share a KV head are no longer packed together, so each decode row reads its K
and V once per *query* head instead of once per KV head. `data/attention_backends.csv` holds, per GPU,
a two-term fit of measured kernel times, t = per-query-head K/V bytes / rate_q + per-KV-head bytes /
rate_kv (with the source of the measurements); the cost model prices a mixed batch's decode rows with it. GPUs without a row keep the plain roofline.
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
