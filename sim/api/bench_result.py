"""A run's results in the JSON schema of `vllm bench serve --save-result`.

Same keys, units and statistics as vLLM's serving benchmark (its `result_json`): setup keys
(date, backend, model_id, num_prompts, request_rate, burstiness, max_concurrency), counts and
throughputs, `max_output_tokens_per_s` / `max_concurrent_requests`, and per selected metric
`mean_<m>_ms`, `median_<m>_ms`, `std_<m>_ms`, `p<P>_<m>_ms`. `detailed` adds the per-request lists
(input_lens, output_lens, ttfts, itls, latencies, start_times, errors; seconds). Tools that read
vLLM's result files (plotting scripts, dashboards) read these. servesim adds `servesim_version`.
"""
from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

import numpy as np

from sim.api.metrics import LATENCY_METRICS, itl_stats, latency_stats

BACKEND = "servesim"
VLLM_DEFAULT_METRICS = ("ttft", "tpot", "itl")
VLLM_DEFAULT_PERCENTILES = (99.0,)


def traffic(config: dict) -> dict:
    """request_rate ("inf" when all arrive at once or a closed loop sets the pace), burstiness
    (gamma shape = 1 / cv^2; 1.0 is Poisson) and max_concurrency (closed-loop users)."""
    wl = config.get("workload", {})
    kind = wl.get("kind")
    rate = wl.get("target_rate") if kind == "trace" else wl.get("rate")
    cv = wl.get("cv") if kind == "gamma" else None
    return {"request_rate": "inf" if kind == "closed_loop" or rate is None else rate,
            "burstiness": 1.0 / cv ** 2 if cv else 1.0,
            "max_concurrency": wl.get("num_users") if kind == "closed_loop" else None}


def bench_serve_result(results, percentile_metrics=VLLM_DEFAULT_METRICS,
                       metric_percentiles=VLLM_DEFAULT_PERCENTILES, *, label: str | None = None,
                       metadata: dict | None = None, detailed: bool = False, date: str | None = None) -> dict:
    """The dict vLLM's `--save-result` writes, for `results` (a sim Results)."""
    from sim.api.version import __version__
    s, config = results.summary, results.meta.get("config", {})
    model = config.get("deployment", {}).get("model")
    doc = {"date": date or datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": BACKEND,
           "backend": BACKEND, "label": label, "model_id": model, "tokenizer_id": model,
           "num_prompts": s["num_requests"], **(metadata or {}), **traffic(config),
           "duration": s["duration"], "completed": s["completed"], "failed": s["failed"],
           "total_input_tokens": s["total_input_tokens"], "total_output_tokens": s["total_output_tokens"],
           "request_throughput": s["request_throughput"],
           "request_goodput": s["request_goodput"] if results.meta.get("slo") else None,
           "output_throughput": s["output_throughput"], "total_token_throughput": s["total_token_throughput"]}
    if detailed:
        doc.update(per_request_lists(results))
    doc["max_output_tokens_per_s"] = s["max_output_tokens_per_s"]
    doc["max_concurrent_requests"] = s["max_concurrent_requests"]
    done = results.requests[results.requests["completed"].astype(bool)]
    for metric in percentile_metrics:
        column = LATENCY_METRICS[metric]
        doc.update(itl_stats(results.token_times, results.requests["completed"].astype(bool).to_numpy(),
                             metric_percentiles) if column == "itl"
                   else latency_stats(done[column], metric, metric_percentiles))
    doc["servesim_version"] = __version__
    return {k: _strict(v) for k, v in doc.items()}


def per_request_lists(results) -> dict:
    """vLLM's per-request lists (seconds), one entry per request in arrival order."""
    req = results.requests
    ok = req["completed"].astype(bool).to_numpy()
    itls = [np.diff(np.asarray(t, dtype=float)).tolist() if t is not None and good else []
            for t, good in zip(results.token_times, ok)]
    errors = ["" if good else ("rejected: longer than max_model_len" if rejected else f"finish_reason={reason}")
              for good, rejected, reason in zip(ok, req["rejected"], req["finish_reason"])]
    return {"input_lens": req["num_prompt_tokens"].astype(int).tolist(),
            "output_lens": req["num_output_tokens"].astype(int).tolist(),
            "ttfts": [_strict(v) for v in req["ttft_s"].where(ok).tolist()],
            "itls": itls,
            "latencies": [_strict(v) for v in req["e2e_s"].where(ok).tolist()],
            "start_times": req["arrival_time"].astype(float).tolist(),
            "errors": errors}


def result_filename(doc: dict, label: str | None = None) -> str:
    """vLLM's default name: <label or backend>-<rate>qps-<model>-<date>.json."""
    path = Path(str(doc.get("model_id") or "model"))
    model = path.parent.name if path.suffix == ".json" else path.name
    concurrency = f"-concurrency{doc['max_concurrency']}" if doc.get("max_concurrency") is not None else ""
    return f"{label or doc['backend']}-{doc['request_rate']}qps{concurrency}-{model}-{doc['date']}.json"


def _strict(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) or math.isinf(value) else float(value)
    return value
