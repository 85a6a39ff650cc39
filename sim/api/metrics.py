"""Serving metrics, defined as the common serving benchmarks (vLLM's benchmark_serving) define them.

- TTFT: first token time - arrival.
- TPOT: (E2E - TTFT) / (output tokens - 1); excludes the first token; requests with one token have none.
- ITL: gaps between consecutive tokens of a request, pooled over requests.
- E2EL: finish - arrival.  Queueing delay: first scheduled - arrival.
- Throughput over the run's span (first arrival to last finish): requests/s, output tokens/s,
  total (prompt + output) tokens/s.
- Goodput: completed requests per second that meet every given SLO; SLO attainment: their fraction.
Only completed requests (finish_reason "stop" or "length", not rejected) enter latency figures.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from sim.api.spec_metrics import spec_decode_summary

PERCENTILES = (50, 90, 99)


def describe(values, name: str, scale: float = 1.0) -> dict[str, float]:
    """mean and p50/p90/p99 of `values` (NaN when empty), keyed `<name>_mean`, `<name>_p50`, ..."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)] * scale
    out = {f"{name}_mean": float(arr.mean()) if arr.size else float("nan")}
    for p in PERCENTILES:
        out[f"{name}_p{p}"] = float(np.percentile(arr, p)) if arr.size else float("nan")
    return out


def add_latency_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Derived per-request columns: ttft_s, tpot_s, e2e_s, queueing_s, completed."""
    df["ttft_s"] = df["first_token_time"] - df["arrival_time"]
    df["e2e_s"] = df["finish_time"] - df["arrival_time"]
    df["queueing_s"] = df["first_scheduled_time"] - df["arrival_time"]
    decode_tokens = (df["num_output_tokens"] - 1).where(df["num_output_tokens"] > 1)
    df["tpot_s"] = (df["e2e_s"] - df["ttft_s"]) / decode_tokens
    df["completed"] = df["finish_reason"].isin(["stop", "length"]) & ~df["rejected"]
    return df


def meets_slo(df: pd.DataFrame, ttft_s: float | None = None, tpot_s: float | None = None,
              e2e_s: float | None = None) -> pd.Series:
    """Completed requests meeting every given SLO (a request with no TPOT meets a TPOT SLO)."""
    ok = df["completed"].copy()
    if ttft_s is not None:
        ok &= df["ttft_s"] <= ttft_s
    if tpot_s is not None:
        ok &= df["tpot_s"].fillna(0.0) <= tpot_s
    if e2e_s is not None:
        ok &= df["e2e_s"] <= e2e_s
    return ok


def itl_values(token_times, completed: np.ndarray) -> np.ndarray:
    """Pooled inter-token gaps of completed requests (empty if token times were not kept).

    Tokens emitted by one step (speculative decoding) reach the client as one chunk, so, as in
    vLLM's serving benchmark, a gap is counted between chunks: zero gaps are dropped."""
    gaps = [np.diff(np.asarray(t, dtype=float)) for t, ok in zip(token_times, completed)
            if ok and t is not None and len(t) > 1]
    if not gaps:
        return np.empty(0)
    pooled = np.concatenate(gaps)
    return pooled[pooled > 0]


def kv_occupancy(steps: pd.DataFrame, num_gpu_blocks: int) -> dict[str, float]:
    """Time-weighted mean and peak KV-block occupancy, and the fraction of busy time above 90%."""
    if steps.empty:
        return {"kv_occupancy_mean": 0.0, "kv_occupancy_peak": 0.0, "kv_time_above_90pct": 0.0}
    occ = steps["kv_blocks_used"].to_numpy() / num_gpu_blocks
    dur = steps["duration"].to_numpy()
    total = dur.sum()
    return {
        "kv_occupancy_mean": float((occ * dur).sum() / total) if total else float(occ.mean()),
        "kv_occupancy_peak": float(occ.max()),
        "kv_time_above_90pct": float(dur[occ > 0.9].sum() / total) if total else 0.0,
    }


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, token_times, num_gpu_blocks: int,
              slo: dict | None = None) -> dict[str, float]:
    """The run's summary: latencies, throughput, goodput, preemption, prefix caching, KV occupancy."""
    done = requests[requests["completed"]]
    span = float(requests["finish_time"].max() - requests["arrival_time"].min()) if len(done) else 0.0
    per_s = (lambda x: x / span) if span > 0 else (lambda x: float("nan"))
    out = {
        "num_requests": int(len(requests)),
        "num_completed": int(len(done)),
        "num_aborted": int((requests["finish_reason"] == "abort").sum()),
        "num_rejected": int(requests["rejected"].sum()),
        "duration_s": span,
        "request_throughput": per_s(len(done)),
        "output_token_throughput": per_s(float(done["num_output_tokens"].sum())),
        "total_token_throughput": per_s(float(done["num_output_tokens"].sum() + done["num_prompt_tokens"].sum())),
    }
    for column, name in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_s", "e2e"), ("queueing_s", "queueing")):
        out.update(describe(done[column], f"{name}_ms" if name != "e2e" else "e2e_s",
                            1e3 if name != "e2e" else 1.0))
    out.update(describe(itl_values(token_times, requests["completed"].to_numpy()), "itl_ms", 1e3))
    out.update(_goodput(requests, slo or {}, per_s))
    prompt = float(requests["num_prompt_tokens"].sum())
    out["prefix_cache_hit_rate"] = float(requests["num_cached_tokens"].sum()) / prompt if prompt else 0.0
    out["num_preemptions"] = int(requests["num_preemptions"].sum())
    out["preempted_request_fraction"] = float((requests["num_preemptions"] > 0).mean()) if len(requests) else 0.0
    out.update(kv_occupancy(steps, num_gpu_blocks))
    out.update(spec_decode_summary(steps, float(requests["num_output_tokens"].sum())))
    return out


def _goodput(requests: pd.DataFrame, slo: dict, per_s) -> dict[str, float]:
    ok = meets_slo(requests, slo.get("ttft_s"), slo.get("tpot_s"), slo.get("e2e_s"))
    n = len(requests)
    return {"goodput": per_s(float(ok.sum())), "slo_attainment": float(ok.sum()) / n if n else float("nan")}
