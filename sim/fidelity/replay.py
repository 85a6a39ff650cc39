"""Replay a real run in the simulator under its engine arguments.

One engine replica for DP1 runs through `sim.api.simulator.simulate`. A data-parallel MoE run (DP2 + expert
parallelism) runs `sim.fidelity.dp` instead: the ranks step in lockstep, as vLLM's DP engines do.
"""
from __future__ import annotations

import dataclasses


from sim.api.sections import DeploymentConfig
from sim.api.simulator import SimulationConfig, simulate
from sim.api.validation import gpu_batch_defaults
from sim.core.batch_defaults import with_batch_defaults
from sim.core.config import EngineConfig
from sim.core.scheduler_profiles import major_minor, profile_for_version
from kernels_cost_model import get_model, make_cost_model
from kernels_cost_model.builder import shipped_variants
from kernels_cost_model.gpu_calibration import left_out_calibration
from kernels_cost_model.hardware import get_gpu

from .dp import replay_data_parallel
from .host import UNFITTED, HostFit
from .real_runs import RealRun
from .tables import Replay, request_table, step_table

ARRIVALS = ("queued", "workload")


def engine_config(run: RealRun, recorded_blocks: bool = True) -> EngineConfig:
    """vLLM's engine arguments of the run, scheduled as its release does (`run_scheduler_profile`).
    max_model_len None means the model's own limit; an unset max_num_seqs or max_num_batched_tokens,
    vLLM's default for the run's GPU and entry point (`usage_context`: `vllm serve`'s unless the run says
    otherwise). The KV cache holds the blocks the run recorded (`RealRun.recorded_blocks`: vLLM's
    start-up log or meta) where it recorded them and `recorded_blocks`, else servesim sizes it."""
    kw = run.engine_kwargs
    spec = get_model(kw["model"])
    engine = EngineConfig(num_gpu_blocks=run.recorded_blocks if recorded_blocks else None,
                          block_size=run.setting("block_size"),
                          max_model_len=kw.get("max_model_len") or spec.max_position_embeddings,
                          max_num_seqs=kw.get("max_num_seqs"), max_num_batched_tokens=kw.get("max_num_batched_tokens"),
                          enable_chunked_prefill=run.setting("enable_chunked_prefill"),
                          enable_prefix_caching=run.setting("enable_prefix_caching"),
                          usage_context=run.setting("usage_context"), scheduler_profile=run_scheduler_profile(run),
                          record_token_times=False)
    defaults = gpu_batch_defaults(engine, run.gpu)  # (None: the GPU's error comes later)
    return engine.resolved() if defaults is None else with_batch_defaults(engine, *defaults)


def run_scheduler_profile(run: RealRun) -> str:
    """The scheduler profile of the run's own vLLM release (`vllm-<major.minor>`) where servesim has one,
    else the newest."""
    return profile_for_version(run.meta.get("vllm_version", "")) or "vllm"


def run_calibration(run: RealRun) -> str:
    """The kernels measured under the run's own vLLM version (`<gpu>@vllm-<major.minor>`) where such a
    calibration ships, else the GPU's default one."""
    name = f"{get_gpu(run.gpu).name}@vllm-{major_minor(run.meta.get('vllm_version', ''))}"
    return name if name in shipped_variants() else "default"


def deployment_config(run: RealRun, host: HostFit = UNFITTED) -> DeploymentConfig:
    """The run's GPUs and parallelism, with the runs' host figures `host` (`sim.fidelity.fit`). The CPU
    time is added in full (`cpu_gpu_overlap=False`): the host figures and docs/fidelity.md were fitted
    that way, and how much of it the runs' async scheduling hid is not measured."""
    kw = run.engine_kwargs
    return DeploymentConfig(model=kw["model"], gpu=run.gpu, calibration=run_calibration(run),
                            tensor_parallel_size=int(kw["tensor_parallel_size"]),
                            gpu_memory_utilization=run.setting("gpu_memory_utilization"),
                            kv_cache_dtype=kw.get("kv_cache_dtype") or "auto",
                            collective_scale=host.collective_scale, cpu_per_request_s=host.cpu_per_request_s,
                            cpu_gpu_overlap=False)


def simulation_config(run: RealRun, host: HostFit = UNFITTED, recorded_blocks: bool = True) -> SimulationConfig:
    return SimulationConfig(engine=engine_config(run, recorded_blocks), deployment=deployment_config(run, host),
                            seed=0)


def uncalibrated_gpu(name: str):
    """The catalog GPU `name` with its datasheet figures (peaks, memory, link; SM count and L2 size, which
    the catalog keys by GPU) under the name `<gpu>@uncalibrated`, which none of the per-GPU measurement
    tables matches: no collective sweep or measured all-reduce, no mixed-batch attention rates, no
    decode-imbalance alphas. What a GPU with datasheet figures only gets."""
    return dataclasses.replace(get_gpu(name), name=f"{get_gpu(name).name}@uncalibrated")


def leave_gpu_out_cost_model(run: RealRun, host: HostFit = UNFITTED):
    """The replay's step-time model with the runs' GPU treated as uncalibrated (leave one GPU out,
    docs/fidelity.md): every kernel family at the defaults derived from the *other* calibrated GPUs
    (`left_out_calibration`, per shape), at this GPU's datasheet peaks (`uncalibrated_gpu`); collectives
    as latency + bytes at the derived PCIe all-reduce efficiency of the catalog's link. CPU time,
    CUDA-graph sizes and max_model_len as in `simulation_config`."""
    d, e = deployment_config(run, host), engine_config(run)
    gpu = uncalibrated_gpu(d.gpu)
    cal = dataclasses.replace(left_out_calibration(d.gpu), device=gpu.name)
    return make_cost_model(d.model, gpu, d.tensor_parallel_size, calibration=cal,
                           async_scheduling=bool(d.cpu_gpu_overlap), collective_scale=d.collective_scale,
                           cpu_per_request_s=d.cpu_per_request_s, max_num_seqs=e.max_num_seqs,
                           max_model_len=e.max_model_len)


def replay_workload(run: RealRun, arrivals: str = "queued") -> list:
    """The run's requests; arrivals at the engine's measured `queued_ts` (default, the clock the
    latencies are measured from) or at the workload file's `arrival_time_ns`."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals={arrivals!r}: must be one of {ARRIVALS}")
    specs = run.workload
    if arrivals == "workload":
        t0 = specs[0].arrival_time_s
        return [dataclasses.replace(s, arrival_time_s=s.arrival_time_s - t0) for s in specs]
    queued = dict(zip(run.measured["request_id"], run.measured["arrival_s"]))
    moved = [dataclasses.replace(s, arrival_time_s=float(queued[s.request_id])) for s in specs]
    return sorted(moved, key=lambda s: s.arrival_time_s)


def replay(run: RealRun, arrivals: str = "queued", config: SimulationConfig | None = None,
           cost_model=None) -> Replay:
    """Simulate the run; DP > 1 goes through the lockstep DP loop. `cost_model`: one rank's step-time
    model instead of the deployment's (e.g. `leave_gpu_out_cost_model`)."""
    config = config or simulation_config(run)
    specs = replay_workload(run, arrivals)
    if run.data_parallel_size > 1:
        return replay_data_parallel(config, specs, run.data_parallel_size,
                                    bool(run.engine_kwargs.get("enable_expert_parallel")), cost_model)
    res = simulate(config, workload=specs, cost_model=cost_model)
    return Replay(request_table(res.requests), step_table(res.steps), res.meta["num_gpu_blocks"])
