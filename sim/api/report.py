"""The summary of a run as a plain-text table (what `servesim run` prints)."""
from __future__ import annotations

import math

from sim.api.spec_metrics import format_spec_decode

LATENCY_ROWS = (  # (label, summary key prefix, unit)
    ("TTFT", "ttft_ms", "ms"),
    ("TPOT (excl. 1st token)", "tpot_ms", "ms"),
    ("ITL", "itl_ms", "ms"),
    ("E2E latency", "e2e_s", "s"),
    ("Queueing delay", "queueing_ms", "ms"),
)


def _num(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:,.{digits}f}"


def describe_setup(meta: dict) -> str:
    """One line naming model, GPU, policy and traffic from a Results.meta."""
    config = meta.get("config") or {}
    dep, eng, wl = config.get("deployment", {}), config.get("engine", {}), config.get("workload", {})
    kind = wl.get("kind")
    traffic = {"trace": f"trace {wl.get('path')}",
               "closed_loop": f"closed loop, {wl.get('num_users')} users",
               "sessions": f"chat sessions starting at {wl.get('rate')}/s"}.get(kind, f"{kind} {wl.get('rate')} req/s")
    if kind not in ("trace", "sessions"):
        traffic += f", {wl.get('lengths')} lengths"
    return (f"{dep.get('model')} on {dep.get('tensor_parallel_size')}x {dep.get('gpu')} "
            f"({dep.get('cost_model')} cost model), policy {eng.get('policy')}, "
            f"{meta.get('num_gpu_blocks')} KV blocks of {meta.get('block_size')} tokens; "
            f"{traffic}; seed {config.get('seed')}")


def format_summary(summary: dict, meta: dict | None = None) -> str:
    """A readable multi-section table of a summary dict (keys of sim.api.metrics.summarize)."""
    s = summary
    lines = []
    if meta:
        lines += [describe_setup(meta), ""]
    lines.append(f"Requests     {s['num_completed']} completed of {s['num_requests']}"
                 f" ({s['num_aborted']} aborted, {s['num_rejected']} rejected)"
                 f" over {_num(s['duration_s'])} s simulated")
    lines.append(f"Throughput   {_num(s['request_throughput'])} req/s, "
                 f"{_num(s['output_token_throughput'], 0)} output tok/s, "
                 f"{_num(s['total_token_throughput'], 0)} total tok/s")
    slo = (meta or {}).get("slo") or {}
    targets = ", ".join(f"{k.removesuffix('_s').upper()} <= {v * 1e3:g} ms" for k, v in slo.items())
    if targets:
        lines.append(f"Goodput      {_num(s['goodput'])} req/s meeting SLO ({targets}); "
                     f"attainment {_num(100 * s['slo_attainment'], 1)}%")
    else:
        lines.append("Goodput      - (no SLO given; set --slo-ttft / --slo-tpot)")
    lines += ["", f"{'Latency':30s}{'mean':>10s}{'p50':>10s}{'p90':>10s}{'p99':>10s}"]
    for label, key, unit in LATENCY_ROWS:
        cells = "".join(f"{_num(s[f'{key}_{q}']):>10s}" for q in ("mean", "p50", "p90", "p99"))
        lines.append(f"{label + ' (' + unit + ')':30s}{cells}")
    lines += ["",
              f"KV cache     occupancy mean {_num(100 * s['kv_occupancy_mean'], 1)}%, "
              f"peak {_num(100 * s['kv_occupancy_peak'], 1)}%, "
              f"above 90% for {_num(100 * s['kv_time_above_90pct'], 1)}% of busy time",
              f"Scheduling   {s['num_preemptions']} preemptions "
              f"({_num(100 * s['preempted_request_fraction'], 1)}% of requests); "
              f"prefix-cache hit rate {_num(100 * s['prefix_cache_hit_rate'], 1)}%"]
    lines += format_spec_decode(s)
    return "\n".join(lines)
