"""The step-time model a deployment asks for, and its one-line description for a run's header."""
from __future__ import annotations

import dataclasses

from kernels_cost_model.calibration import derived_from
from sim.api.sections import DeploymentConfig, within
from sim.api.validation import resolve_engine
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.scheduler_profiles import get_scheduler_profile


def cpu_gpu_overlap(deployment: DeploymentConfig, engine: EngineConfig | None = None) -> bool:
    """Whether CPU time hides behind GPU time: the setting, else the engine's async scheduling."""
    if deployment.cpu_gpu_overlap is not None:
        return deployment.cpu_gpu_overlap
    return (engine if engine is not None else EngineConfig()).is_async


def build_cost_model(deployment: DeploymentConfig, engine: EngineConfig | None = None, speculative=None):
    """The step-time model a deployment asks for. `engine` (None: the default engine) sets the CUDA-graph
    capture sizes decode batches pad to (vLLM's for its max_num_seqs; `speculative`, a SpeculativeConfig,
    widens them to its decode rows of 1 + k tokens), the max_model_len an FA2 decode
    graph's split count is decided at and, when
    `deployment.cpu_gpu_overlap` is unset, whether CPU time overlaps GPU time (its async scheduling)."""
    if deployment.cost_model == "linear":
        return LinearCostModel()
    from kernels_cost_model import make_cost_model
    if engine is not None and engine.max_num_seqs is None:  # (vLLM's default for the GPU)
        engine = dataclasses.replace(engine, max_num_seqs=resolve_engine(engine, deployment).resolved().max_num_seqs)
    with within("deployment"):
        return make_cost_model(deployment.model, deployment.gpu, deployment.tensor_parallel_size,
                               async_scheduling=cpu_gpu_overlap(deployment, engine),
                               collective_scale=deployment.collective_scale,
                               cpu_per_request_s=deployment.cpu_per_request_s,
                               kv_cache_dtype=deployment.kv_cache_dtype,
                               enable_expert_parallel=deployment.enable_expert_parallel,
                               calibration=deployment.calibration, interconnect=deployment.interconnect,
                               clocks=deployment.clocks,
                               **(engine_graph_settings(engine, speculative) if engine is not None else {}))


def engine_graph_settings(engine: EngineConfig, speculative=None) -> dict:
    """The engine settings the cost model's CUDA-graph capture sizes and decode splits follow (and the
    drafts a decode row verifies, with `speculative`)."""
    return {"max_num_seqs": engine.max_num_seqs, "max_model_len": engine.max_model_len,
            "max_num_batched_tokens": engine.max_num_batched_tokens,
            "vllm_release": get_scheduler_profile(engine.scheduler_profile).release,
            "performance_mode": engine.performance_mode,
            "num_speculative_tokens": speculative.num_speculative_tokens if speculative is not None else 0}


def describe_cost_model(cost_model) -> str:
    """What prices the steps, for the summary header: 'roofline cost model calibrated on h100-sxm
    kernels, compute at its power-capped clock (x1.11)', 'uncalibrated roofline cost model (datasheet
    peaks)' or 'linear cost model'. A per-layer-type model (MLA, sliding window, linear attention) is
    described by the roofline it builds on."""
    roofline = getattr(cost_model, "base", cost_model)
    calibration = getattr(roofline, "calibration", None)
    if calibration is None:
        name = "linear" if isinstance(cost_model, LinearCostModel) else type(cost_model).__name__
        return f"{name} cost model"
    factor = getattr(roofline, "compute_clock_factor", 1.0)
    clocks = f", compute at its power-capped clock (x{factor:.2f})" if factor != 1.0 else ""
    if calibration.provenance.get("kind") == "uncalibrated roofline":
        derived = derived_from(calibration) is not None
        return ("uncalibrated roofline cost model (datasheet peaks"
                + (", efficiencies derived from calibrated GPUs)" if derived else ")") + clocks)
    return f"roofline cost model calibrated on {calibration.device} kernels{clocks}"
