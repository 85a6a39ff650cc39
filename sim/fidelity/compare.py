"""Comparison arithmetic, simulated vs measured: pure functions over plain tables.

Relative error = (sim - real) / real. Per-request tables carry `ttft_s`, `tpot_s`, `e2e_s`,
`arrival_s`, `finish_s`, `num_output_tokens`; step tables carry `end_s`, `num_running`,
`num_waiting` and optionally `num_prefill_tokens`/`num_decode_tokens`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from sim.api.metrics import describe

LATENCIES = ("ttft_s", "tpot_s", "e2e_s")


def rel_error(sim: float, real: float) -> float:
    """(sim - real) / real; NaN when real is 0 or either is NaN."""
    if real == 0 or real != real or sim != sim:
        return float("nan")
    return (sim - real) / real


def aggregate(requests: pd.DataFrame) -> dict[str, float]:
    """Latency statistics, duration (first arrival to last finish) and throughputs of one run."""
    out = {}
    for m in LATENCIES:
        out.update(describe(requests[m], m))  # m_mean, m_p50, m_p90, m_p99
    duration = float(requests["finish_s"].max() - requests["arrival_s"].min())
    out["duration_s"] = duration
    out["request_throughput"] = len(requests) / duration if duration > 0 else float("nan")
    out["output_token_throughput"] = (float(requests["num_output_tokens"].sum()) / duration
                                      if duration > 0 else float("nan"))
    return out


def compare_aggregates(sim: pd.DataFrame, real: pd.DataFrame) -> pd.DataFrame:
    """One row per metric: sim, real, rel_error."""
    s, r = aggregate(sim), aggregate(real)
    rows = [(k, s[k], r[k], rel_error(s[k], r[k])) for k in r]
    return pd.DataFrame(rows, columns=["metric", "sim", "real", "rel_error"])


def per_request(sim: pd.DataFrame, real: pd.DataFrame) -> pd.DataFrame:
    """Requests joined on request_id, with sim/real/rel_error per latency."""
    cols = ["request_id", *LATENCIES]
    both = real[cols].merge(sim[cols], on="request_id", suffixes=("_real", "_sim"), validate="1:1")
    for m in LATENCIES:
        both[f"{m}_rel_error"] = (both[f"{m}_sim"] - both[f"{m}_real"]) / both[f"{m}_real"]
    return both


def per_request_summary(joined: pd.DataFrame) -> dict[str, float]:
    """Median absolute per-request relative error and the correlation of sim with real, per latency."""
    out = {}
    for m in LATENCIES:
        err = joined[f"{m}_rel_error"].abs()
        out[f"{m}_median_abs_rel_error"] = float(err.median())
        out[f"{m}_corr"] = float(joined[f"{m}_sim"].corr(joined[f"{m}_real"]))
    return out


def sample_per_second(steps: pd.DataFrame, ticks, columns=("num_running", "num_waiting")) -> pd.DataFrame:
    """Queue lengths at each tick: the state after the last step that ended at or before it
    (zero before the first step), as vLLM's per-second stats logger reports them."""
    ticks = np.asarray(ticks, dtype=float)
    ends = steps["end_s"].to_numpy()
    idx = np.searchsorted(ends, ticks, side="right") - 1
    out = pd.DataFrame({"t": ticks})
    for c in columns:
        values = steps[c].to_numpy()
        out[c] = np.where(idx >= 0, values[np.clip(idx, 0, None)], 0)
    return out


def curve_error(sim: np.ndarray, real: np.ndarray) -> dict[str, float]:
    """How closely one per-second curve follows another: mean absolute difference, and that
    relative to the real curve's mean."""
    n = min(len(sim), len(real))
    sim, real = np.asarray(sim[:n], float), np.asarray(real[:n], float)
    mad = float(np.abs(sim - real).mean()) if n else float("nan")
    mean = float(real.mean()) if n else float("nan")
    return {"mean_abs_diff": mad, "rel_mean_abs_diff": mad / mean if mean else float("nan")}
