"""Serving metrics, named and defined as `vllm bench serve` names and defines them.

- TTFT: first token time - arrival.
- TPOT: (E2EL - TTFT) / (output tokens - 1); excludes the first token; requests with one token have none.
- ITL: gaps between consecutive tokens of a request, pooled over requests.
- E2EL: finish - arrival.  Queueing delay (servesim's own): first scheduled - arrival.
- Throughput over the run's span (first arrival to last finish): requests/s, output tokens/s,
  total (prompt + output) tokens/s.
- request_goodput: completed requests per second that meet every given SLO; slo_attainment: their fraction.
Only completed requests (finish_reason "stop" or "length", not rejected) enter latency figures.

Latency keys follow vllm bench serve: `mean_ttft_ms`, `median_ttft_ms`, `std_ttft_ms` and one
`p<P>_ttft_ms` per requested percentile (default 90 and 99), for ttft, tpot, itl, e2el and queueing.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import pandas as pd

from sim.api.itl import REQUESTS, itl_chunks, tokens_per_second, weighted_stats
from sim.api.spec_metrics import spec_decode_summary

PERCENTILES = (50, 90, 99)
"""Percentiles of `describe` (the fidelity comparison's own statistics)."""
METRIC_PERCENTILES = (90, 99)
"""Percentiles every summary reports beside mean, median and std (`--metric-percentiles`)."""
LATENCY_METRICS = {  # vLLM's metric name -> per-request column (or "itl": pooled token gaps)
    "ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl", "e2el": "e2e_s", "queueing": "queueing_s"}


def describe(values, name: str, scale: float = 1.0) -> dict[str, float]:
    """mean and p50/p90/p99 of `values` (NaN when empty), keyed `<name>_mean`, `<name>_p50`, ..."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)] * scale
    out = {f"{name}_mean": float(arr.mean()) if arr.size else float("nan")}
    for p in PERCENTILES:
        out[f"{name}_p{p}"] = float(np.percentile(arr, p)) if arr.size else float("nan")
    return out


def check_percentiles(percentiles) -> tuple:
    """`percentiles` as a tuple of numbers in (0, 100) (a bare number is one percentile), or a ConfigError."""
    from kernels_cost_model.errors import ConfigError
    from sim.core.fields import is_number
    items = (percentiles,) if is_number(percentiles) else percentiles
    if isinstance(items, (str, bytes, dict)) or not hasattr(items, "__iter__"):
        raise ConfigError("percentiles", percentiles, "must be a list of numbers in (0, 100), e.g. [50, 99.9]")
    items = tuple(items)
    for p in items:
        if not (is_number(p) and 0 < p < 100):
            raise ConfigError("percentiles", p, "must be a number in (0, 100)")
    return tuple(p.item() if isinstance(p, np.generic) else p for p in items)


def percentile_word(p: float) -> str:
    """99 -> '99', 99.9 -> '99.9' (how vLLM spells a percentile in a key)."""
    p = float(p)
    return str(int(p)) if p.is_integer() else str(p)


def latency_key(metric: str, statistic: str | float) -> str:
    """('ttft', 'mean') -> 'mean_ttft_ms'; ('ttft', 99) -> 'p99_ttft_ms'; ('ttft', 50) -> 'median_ttft_ms'."""
    if not isinstance(statistic, str):
        statistic = "median" if float(statistic) == 50 else f"p{percentile_word(statistic)}"
    return f"{statistic}_{metric}_ms"


def latency_stats(values, metric: str, percentiles=METRIC_PERCENTILES) -> dict[str, float]:
    """mean, median, std (population, as numpy and vLLM) and percentiles of seconds `values`, in ms
    (NaN dropped; `values` is left as it is: the figures come from a scaled copy)."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)] * 1e3
    empty = not arr.size
    out = {latency_key(metric, "mean"): float("nan") if empty else float(arr.mean()),
           latency_key(metric, "std"): float("nan") if empty else float(arr.std()),
           # median and percentiles pick order statistics: partitioning arr in place changes none
           latency_key(metric, "median"): float("nan") if empty else float(np.median(arr, overwrite_input=True))}
    for p in percentiles:
        out[f"p{percentile_word(p)}_{metric}_ms"] = float("nan") if empty else float(
            np.percentile(arr, p, overwrite_input=True))
    return {key: out[key] for key in (latency_key(metric, "mean"), latency_key(metric, "median"),
                                      latency_key(metric, "std"), *list(out)[3:])}


def itl_stats(token_times, completed, percentiles=METRIC_PERCENTILES) -> dict[str, float]:
    """ITL statistics in ms of completed requests (keyed as `latency_stats`), from the gaps held as
    weighted chunks (sim.api.itl): median and percentiles equal numpy's on the pooled gaps bit for
    bit; mean and std are exactly rounded (numpy's sums can differ in the last bits)."""
    def key(stat):
        return latency_key("itl", stat) if isinstance(stat, str) else f"p{percentile_word(stat)}_itl_ms"
    return weighted_stats(itl_chunks(token_times, completed), percentiles, key)


def add_latency_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Derived per-request columns: ttft_s, tpot_s, e2e_s, queueing_s, completed."""
    df["ttft_s"] = df["first_token_time"] - df["arrival_time"]
    df["e2e_s"] = df["finish_time"] - df["arrival_time"]
    df["queueing_s"] = df["first_scheduled_time"] - df["arrival_time"]
    decode_tokens = (df["num_output_tokens"] - 1).where(df["num_output_tokens"] > 1)
    df["tpot_s"] = (df["e2e_s"] - df["ttft_s"]) / decode_tokens
    df["completed"] = df["finish_reason"].isin(["stop", "length"]) & ~df["rejected"].astype(bool)
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


def kv_occupancy(steps, num_gpu_blocks: int) -> dict[str, float]:
    """Time-weighted mean and peak KV-block occupancy, and the fraction of busy time above 90%.
    `steps`: the per-step DataFrame or a `StepTable` (columns read in place)."""
    if steps.empty:
        return {"kv_occupancy_mean": 0.0, "kv_occupancy_peak": 0.0, "kv_time_above_90pct": 0.0}
    occ = np.array(steps["kv_blocks_used"], dtype=float)  # a copy of its own, divided in place
    occ /= num_gpu_blocks
    dur = np.asarray(steps["duration"])
    total = dur.sum()
    out = {"kv_occupancy_peak": float(occ.max()),
           "kv_time_above_90pct": float(dur[occ > 0.9].sum() / total) if total else 0.0}
    # then occupancy x duration, in place (the same products, summed the same way)
    mean = float(np.multiply(occ, dur, out=occ).sum() / total) if total else float(occ.mean())
    return {"kv_occupancy_mean": mean, **out}


def peak_output_rate(done: pd.DataFrame, token_times, chunk: int = REQUESTS) -> dict[str, float]:
    """vLLM's peak figures: output tokens in the busiest one-second window from the first arrival,
    and the requests in flight (arrived, not finished) during that second (tokens counted per
    second by `tokens_per_second`, `chunk` requests at a time, from runs where token times are kept
    as runs)."""
    index = done.index.to_numpy()
    index = index[index < len(token_times)]
    start = float(done["arrival_time"].min()) if len(done) else 0.0
    seconds, counts = tokens_per_second(token_times, index, start, chunk)
    if not counts.sum():
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    busiest = int(counts.argmax())  # the first of equal maxima, as over every second in order
    second = int(seconds[busiest])
    lo, hi = start + second, start + second + 1
    in_flight = (done["arrival_time"] < hi) & (done["finish_time"] >= lo)
    return {"max_output_tokens_per_s": float(counts[busiest]), "max_concurrent_requests": int(in_flight.sum())}


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, token_times, num_gpu_blocks: int,
              slo: dict | None = None, percentiles=METRIC_PERCENTILES, kv: dict | None = None) -> dict[str, float]:
    """The run's summary: counts, throughput, latencies, goodput, preemption, prefix caching, KV.

    The figures that allocate most (KV occupancy: a float per step; ITL) are computed first, before
    any copy of the completed requests' rows; those rows are read one column at a time. `kv`: the
    `kv_occupancy` of `steps` when the caller computed it already (before building `requests`)."""
    kv = kv if kv is not None else kv_occupancy(steps, num_gpu_blocks)
    completed = requests["completed"].to_numpy(dtype=bool)
    itl = itl_stats(token_times, completed, percentiles)
    done = requests.loc[completed, ["arrival_time", "finish_time"]]
    span = float(requests["finish_time"].max() - requests["arrival_time"].min()) if len(done) else 0.0
    per_s = (lambda x: x / span) if span > 0 else (lambda x: float("nan"))
    out_tokens = int(requests["num_output_tokens"].to_numpy()[completed].sum())
    in_tokens = int(requests["num_prompt_tokens"].to_numpy()[completed].sum())
    out = Summary({
        "num_requests": int(len(requests)),
        "completed": int(len(done)),
        "failed": int(len(requests) - len(done)),
        "num_aborted": int((requests["finish_reason"] == "abort").sum()),
        "num_rejected": int(requests["rejected"].sum()),
        "duration": span,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": per_s(len(done)),
        "output_throughput": per_s(float(out_tokens)),
        "total_token_throughput": per_s(float(out_tokens + in_tokens)),
    })
    out.update(peak_output_rate(done, token_times))
    for metric, column in LATENCY_METRICS.items():
        out.update(itl if column == "itl" else
                   latency_stats(requests[column].to_numpy(dtype=float)[completed], metric, percentiles))
    out.update(_goodput(requests, slo or {}, per_s))
    prompt = float(requests["num_prompt_tokens"].sum())
    out["prefix_cache_hit_rate"] = float(requests["num_cached_tokens"].sum()) / prompt if prompt else 0.0
    out["num_preemptions"] = int(requests["num_preemptions"].sum())
    out["preempted_request_fraction"] = float((requests["num_preemptions"] > 0).mean()) if len(requests) else 0.0
    out.update(kv)
    out.update(spec_decode_summary(steps, float(requests["num_output_tokens"].sum())))
    return out


def _goodput(requests: pd.DataFrame, slo: dict, per_s) -> dict[str, float]:
    ok = meets_slo(requests, slo.get("ttft_s"), slo.get("tpot_s"), slo.get("e2e_s"))
    n = len(requests)
    return {"request_goodput": per_s(float(ok.sum())),
            "slo_attainment": float(ok.sum()) / n if n else float("nan")}


LEGACY_KEYS = {"num_completed": "completed", "duration_s": "duration", "goodput": "request_goodput",
               "output_token_throughput": "output_throughput"}
_LEGACY_LATENCY = re.compile(r"^(ttft|tpot|itl|queueing|e2e)_(ms|s)_(mean|p\d+)$")


class Summary(dict):
    """A run's summary. Keys servesim used before vLLM's names (`ttft_ms_p99`, `e2e_s_mean`,
    `goodput`, ...) still read, converted, with a DeprecationWarning naming the new key."""

    def __missing__(self, key):
        new, scale = legacy_key(key)
        if new is None or new not in self:
            raise KeyError(key)
        warnings.warn(f"summary key {key!r} is deprecated; use {new!r}", DeprecationWarning, stacklevel=2)
        return self[new] * scale


def legacy_key(key: str) -> tuple[str | None, float]:
    """(new key, factor from the new value to the old unit) for an old summary key, or (None, 1)."""
    if key in LEGACY_KEYS:
        return LEGACY_KEYS[key], 1.0
    match = _LEGACY_LATENCY.match(key)
    if match is None:
        return None, 1.0
    metric, unit, stat = match.groups()
    metric = "e2el" if metric == "e2e" else metric
    stat = "median" if stat == "p50" else stat
    return latency_key(metric, stat), 1e-3 if unit == "s" else 1.0
