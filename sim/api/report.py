"""The summary of a run as a plain-text table (what `servesim run` prints).

Columns size to their content; a latency row whose largest figure reaches 10 s is shown in seconds.
"""
from __future__ import annotations

import math
import re

from sim.api.spec_metrics import format_spec_decode
from sim.api.metrics import LATENCY_METRICS, latency_key, percentile_word

LATENCY_LABELS = {"ttft": "TTFT", "tpot": "TPOT (excl. 1st token)", "itl": "ITL", "e2el": "E2E latency",
                  "queueing": "Queueing delay"}
SECONDS_FROM_MS = 10_000.0
"""A latency row switches from ms to s once its largest figure reaches this many ms."""


def _num(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:,.{digits}f}"


def describe_cost_model(meta: dict) -> str:
    """The cost model as `simulate` described it (calibrated or not, naming a non-default calibration),
    or the config's name for it."""
    deployment = (meta.get("config") or {}).get("deployment", {})
    described = meta.get("cost_model_description")
    if not described:
        return f"{deployment.get('cost_model')} cost model"
    calibration = deployment.get("calibration", "default")
    return described if calibration in (None, "default") else f"{described}, calibration {calibration}"


def describe_setup(meta: dict) -> str:
    """One line naming model, GPU, cost model, policy and traffic from a Results.meta."""
    config = meta.get("config") or {}
    dep, eng, wl = config.get("deployment", {}), config.get("engine", {}), config.get("workload", {})
    kind = wl.get("kind")
    traffic = {"trace": f"trace {wl.get('path')}",
               "closed_loop": f"closed loop, {wl.get('num_users')} users",
               "sessions": f"chat sessions starting at {wl.get('rate')}/s",
               "conversations": f"conversations {wl.get('path')} (closed loop)"}.get(kind, f"{kind} {wl.get('rate')} req/s")
    if kind == "trace" and wl.get("target_rate") is not None:
        traffic += f" rescaled to {wl['target_rate']:g} req/s"
    if kind == "gamma" and wl.get("cv") is not None:
        traffic += f" (cv {wl['cv']:g})"
    if kind not in ("trace", "sessions", "conversations"):
        traffic += f", {wl.get('lengths')} lengths"
    pools = meta.get("pools")
    hardware = f"{meta.get('num_gpus')} GPUs ({pools})" if pools else f"{_gpus(meta, dep)} {dep.get('gpu')}"
    if dep.get("interconnect") not in (None, "auto"):
        hardware += f" over {dep['interconnect']}"
    blocks = "" if pools else f"{meta.get('num_gpu_blocks')} KV blocks of {meta.get('block_size')} tokens; "
    if not pools and meta.get("block_size_asked"):
        blocks = (f"{meta.get('num_gpu_blocks')} KV blocks of {meta.get('block_size')} tokens (block_size "
                  f"{meta['block_size_asked']} raised, as vLLM does, so one page holds a linear-attention state); ")
    batch = ""
    if eng.get("max_num_seqs") is not None:
        batch = f" (max_num_seqs {eng['max_num_seqs']}, max_num_batched_tokens {eng.get('max_num_batched_tokens')})"
    return (f"{dep.get('model')} on {hardware} ({describe_cost_model(meta)}), policy {eng.get('policy')}{batch}, "
            f"{blocks}{traffic}; seed {config.get('seed')}")


def _gpus(meta: dict, dep: dict) -> str:
    """"2x" for TP 2; "4x (TP 2 x PP 2)" when pipeline stages multiply the GPUs of a replica; "4x (TP 1 x
    DP 4)" for data-parallel ranks."""
    tp = dep.get("tensor_parallel_size")
    pp = meta.get("pipeline_parallel_size") or (meta.get("pipeline") or {}).get("pipeline_parallel_size") or 1
    dp = dep.get("data_parallel_size") or 1
    if tp is None or pp == dp == 1:
        return f"{tp}x"
    return f"{tp * pp}x (TP {tp} x PP {pp})" if dp == 1 else f"{tp * dp}x (TP {tp} x DP {dp})"


def kv_capacity_lines(meta: dict) -> list[str]:
    """vLLM's start-up log lines on the KV cache: its size in tokens and how many requests of
    max_model_len tokens it holds at once (empty when the meta lacks them)."""
    blocks, block_size = meta.get("num_gpu_blocks"), meta.get("block_size")
    if meta.get("pools"):
        return []  # a P:D deployment holds a request's KV in both pools: per-pool lines say more
    max_len = ((meta.get("config") or {}).get("engine") or {}).get("max_model_len")
    if not (blocks and block_size and max_len):
        return []
    tokens = meta.get("kv_cache_tokens") or blocks * block_size
    concurrency = meta.get("max_concurrency") or tokens / max_len
    rank = " per DP rank" if (meta.get("data_parallel_size") or 1) > 1 else ""
    return [f"GPU KV cache size: {tokens:,} tokens{rank}",
            f"Maximum concurrency for {max_len:,} tokens per request: {concurrency:.2f}x{rank}"]


def summary_percentiles(summary: dict) -> list[str]:
    """The percentile words a summary holds (from its TTFT keys), e.g. ['90', '99']."""
    found = (re.fullmatch(r"p([\d.]+)_ttft_ms", key) for key in summary)
    return sorted((m.group(1) for m in found if m), key=float)


def latency_table(summary: dict, metrics=None, percentiles=None) -> list[str]:
    """Rows of the latency table: label, then mean, median and each percentile, sized to fit."""
    metrics = list(metrics or LATENCY_METRICS)
    percentiles = [percentile_word(p) for p in (percentiles or summary_percentiles(summary)) if float(p) != 50]
    stats = ["mean", "median"] + [f"p{p}" for p in percentiles]
    rows = []
    for metric in metrics:
        values = [summary.get(latency_key(metric, "mean"))] + [
            summary.get(f"{s}_{metric}_ms") for s in stats[1:]]
        finite = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
        seconds = bool(finite) and max(abs(v) for v in finite) >= SECONDS_FROM_MS
        unit, scale = ("s", 1e-3) if seconds else ("ms", 1.0)
        cells = [_num(v * scale if isinstance(v, (int, float)) else v) for v in values]
        rows.append([f"{LATENCY_LABELS.get(metric, metric)} ({unit})"] + cells)
    header = ["Latency"] + stats
    return align([header] + rows)


def align(rows: list[list[str]]) -> list[str]:
    """Left-aligned first column, right-aligned others, each as wide as its widest cell + 2."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [row[0].ljust(widths[0]) + "".join(cell.rjust(w + 2) for cell, w in zip(row[1:], widths[1:]))
            for row in rows]


def format_summary(summary: dict, meta: dict | None = None, metrics=None, percentiles=None) -> str:
    """A readable multi-section table of a summary dict (keys of sim.api.metrics.summarize).

    metrics: latency rows to show (`--percentile-metrics`, default all); percentiles: columns
    beside mean and median (`--metric-percentiles`, default those the summary holds)."""
    s = summary
    lines = []
    if meta:
        lines += [describe_setup(meta)] + kv_capacity_lines(meta) + [""]
    lines.append(f"Requests     {s['completed']} completed of {s['num_requests']}"
                 f" ({s['num_aborted']} aborted, {s['num_rejected']} rejected)"
                 f" over {_num(s['duration'])} s simulated")
    lines.append(f"Throughput   {_num(s['request_throughput'])} req/s, "
                 f"{_num(s['output_throughput'], 0)} output tok/s, "
                 f"{_num(s['total_token_throughput'], 0)} total tok/s")
    slo = (meta or {}).get("slo") or {}
    targets = ", ".join(f"{k.removesuffix('_s').upper()} <= {v * 1e3:g} ms" for k, v in slo.items())
    if targets:
        lines.append(f"Goodput      {_num(s['request_goodput'])} req/s meeting SLO ({targets}); "
                     f"attainment {_num(100 * s['slo_attainment'], 1)}%")
    else:
        lines.append("Goodput      - (no SLO given; set --slo-ttft / --slo-tpot)")
    lines += [""] + latency_table(s, metrics, percentiles)
    lines += ["",
              f"KV cache     occupancy mean {_num(100 * s['kv_occupancy_mean'], 1)}%, "
              f"peak {_num(100 * s['kv_occupancy_peak'], 1)}%, "
              f"above 90% for {_num(100 * s['kv_time_above_90pct'], 1)}% of busy time",
              f"Scheduling   {s['num_preemptions']} preemptions "
              f"({_num(100 * s['preempted_request_fraction'], 1)}% of requests); "
              f"prefix-cache hit rate {_num(100 * s['prefix_cache_hit_rate'], 1)}%"]
    lines += format_cpu_tier(s) + format_spec_decode(s)
    return "\n".join(lines)


def format_cpu_tier(s: dict) -> list[str]:
    """The CPU KV tier's line (`--kv-offloading-size`), when the run had one."""
    if "cpu_prefix_hit_rate" not in s:
        return []
    return [f"CPU KV tier  prefix hits {_num(100 * s['gpu_prefix_hit_rate'], 1)}% from GPU, "
            f"{_num(100 * s['cpu_prefix_hit_rate'], 1)}% from CPU; {s['cpu_offloaded_blocks']:,} blocks stored "
            f"in {_num(s.get('cpu_store_s', 0.0))} s, {s['cpu_loaded_blocks']:,} loaded back in {_num(s['cpu_load_s'])} s"]
