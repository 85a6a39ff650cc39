"""Fit a host's figures from a user's own measured vLLM run, with the kernels held at their calibration.

`servesim calibrate --from-run RUN_DIR --out deployment.toml` (run folder in the shared runs' format:
`meta.json`, `requests.jsonl`, `timeseries.csv`, workload beside it; see real_runs.py):

1. Every 5th request by arrival (rank % 5 == 2) is held out; the others form the fit split.
2. The whole run is replayed (queueing needs every request), scoring only fit-split requests: the root
   mean square of the relative errors of their mean TTFT, TPOT and E2E. Grid search, in order:
   engine time per scheduled request per step (`cpu_per_request_s`), then, on a multi-GPU run, a
   multiplier on collective times (`collective_scale`) with the first fixed.
3. The same three errors on the held-out requests are reported, and a deployment file that
   `servesim run --config` reads is written, every fitted figure labelled as fitted.
Kernel prices stay at the GPU's shipped calibration: only host figures are fitted.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .compare import rel_error
from .host import HostFit
from .real_runs import RealRun
from .replay import replay, simulation_config

HELD_OUT_RULE = "every 5th request by arrival (rank % 5 == 2)"
CPU_GRID = tuple(round(x * 1e-6, 9) for x in range(0, 41, 4))          # 0-40 us per request
SCALE_GRID = tuple(round(1.0 + 0.25 * i, 2) for i in range(11))         # 1.0-3.5
METRICS = ("ttft_s", "tpot_s", "e2e_s")


@dataclass(frozen=True)
class FromRunFit:
    """The fitted host figures, which of them were fitted, and the errors on each split."""

    host: HostFit
    fitted: tuple[str, ...]
    fit_error: dict[str, float]
    held_out_error: dict[str, float]
    held_out_requests: int


def split_requests(measured) -> tuple[set, set]:
    """(fit request ids, held-out request ids) by arrival rank."""
    ids = list(measured.sort_values(["arrival_s", "request_id"])["request_id"])
    held = {r for i, r in enumerate(ids) if i % 5 == 2}
    return set(ids) - held, held


def subset_errors(sim_requests, real_requests, ids: set) -> dict[str, float]:
    """Relative error of the mean of each latency over the requests `ids`."""
    sim = sim_requests[sim_requests["request_id"].isin(ids)]
    real = real_requests[real_requests["request_id"].isin(ids)]
    return {m: rel_error(float(sim[m].mean()), float(real[m].mean())) for m in METRICS}


def _rms(errors: dict[str, float]) -> float:
    return float(np.sqrt(np.mean([e * e for e in errors.values()])))


def fit_from_run(run: RealRun, cpu_grid=CPU_GRID, scale_grid=SCALE_GRID, arrivals: str = "queued") -> FromRunFit:
    """Fit the host figures on the run's fit split and score the held-out split (module docstring)."""
    fit_ids, held_ids = split_requests(run.measured)

    def errors(host: HostFit, ids: set) -> dict[str, float]:
        return subset_errors(replay(run, arrivals, simulation_config(run, host)).requests, run.measured, ids)

    host = min((HostFit(cpu_per_request_s=c) for c in cpu_grid), key=lambda h: _rms(errors(h, fit_ids)))
    _warn_at_edge("cpu_per_request_s", host.cpu_per_request_s, cpu_grid)
    fitted = ["cpu_per_request_s"]
    if int(run.engine_kwargs.get("tensor_parallel_size", 1)) > 1 or run.data_parallel_size > 1:
        host = min((replace(host, collective_scale=s) for s in scale_grid), key=lambda h: _rms(errors(h, fit_ids)))
        _warn_at_edge("collective_scale", host.collective_scale, scale_grid)
        fitted.append("collective_scale")
    final = replay(run, arrivals, simulation_config(run, host)).requests
    return FromRunFit(host, tuple(fitted), subset_errors(final, run.measured, fit_ids),
                      subset_errors(final, run.measured, held_ids), len(held_ids))


def _warn_at_edge(name: str, value: float, grid) -> None:
    """A fitted figure at the top of its grid may want more than the grid holds: say so."""
    if len(grid) > 1 and value == max(grid):
        warnings.warn(f"{name} = {value!r} is the top of its grid ({min(grid)!r}..{max(grid)!r}): the run may want "
                      "more, or this figure is standing in for something the replay leaves out", stacklevel=3)


def deployment_toml(run: RealRun, fit: FromRunFit) -> str:
    """A config file `servesim run --config` reads: the run's deployment and engine, fitted figures labelled."""
    cfg = simulation_config(run, fit.host)
    d, e = cfg.deployment, cfg.engine

    def pct(errors: dict[str, float]) -> str:
        return ", ".join(f"{m.split('_')[0]} {v * 100:+.1f} %" for m, v in errors.items())

    label = f"FITTED end to end on {run.path} ({HELD_OUT_RULE} held out)"
    lines = [
        f"# servesim deployment fitted by `servesim calibrate --from-run` from {run.path}.",
        f"# Kernels: the shipped calibration {d.calibration!r} of {d.gpu} (not fitted). Fitted host figures: {', '.join(fit.fitted)}.",
        f"# Error of mean latencies, fit split: {pct(fit.fit_error)}",
        f"# Error of mean latencies, held-out split ({fit.held_out_requests} requests): {pct(fit.held_out_error)}",
        "", "[engine]",
        f"max_num_seqs = {e.max_num_seqs}", f"max_num_batched_tokens = {e.max_num_batched_tokens}",
        f"block_size = {e.block_size}", f"max_model_len = {e.max_model_len}",
        *([f"num_gpu_blocks = {e.num_gpu_blocks}  # as the run recorded it (vLLM's start-up log or meta), not fitted"]
          if e.num_gpu_blocks is not None else []),
        f"enable_chunked_prefill = {str(e.enable_chunked_prefill).lower()}",
        f"enable_prefix_caching = {str(e.enable_prefix_caching).lower()}",
        "", "[deployment]",
        f'model = "{d.model}"', f'gpu = "{d.gpu}"', f"tensor_parallel_size = {d.tensor_parallel_size}",
        f"gpu_memory_utilization = {d.gpu_memory_utilization}", f'calibration = "{d.calibration}"',
        f'kv_cache_dtype = "{d.kv_cache_dtype}"',
        "cpu_gpu_overlap = false  # as fitted: the CPU time added in full",
        f"cpu_per_request_s = {fit.host.cpu_per_request_s!r}  # {label}",
    ]
    if "collective_scale" in fit.fitted:
        lines.append(f"collective_scale = {fit.host.collective_scale!r}  # {label}")
    return "\n".join(lines) + "\n"


def write_deployment(path: str | Path, run: RealRun, fit: FromRunFit) -> Path:
    path = Path(path)
    path.write_text(deployment_toml(run, fit))
    return path
