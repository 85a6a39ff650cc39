"""servesim's sized KV cache (`num_gpu_blocks`) against what a real run recorded.

vLLM states its KV size at start-up: V1 logs "GPU KV cache size: N tokens" (N = num_gpu_blocks x
block_size), older engines "# GPU blocks: N"; a run may also store `num_gpu_blocks` in its meta.json
(top level, or under `engine_kwargs` / `cache_config`). `recorded_gpu_blocks` finds any of these in a
run folder (meta.json and *.log / *.txt files; sim/fidelity/real_runs.py, where a replay takes the
recorded size); `kv_sizing_error` compares servesim's own sizing with it.
The shared RTX PRO 6000 runs record none (their README), so the error there cannot be stated yet.
"""
from __future__ import annotations

from kernels_cost_model.expert_parallel import ep_kv_cache_blocks
from sim.api.simulator import resolve_num_gpu_blocks

from .real_runs import RealRun
from .replay import simulation_config


def sized_gpu_blocks(run: RealRun) -> int:
    """num_gpu_blocks servesim sizes for one engine of the run, as its replay does (a DP + expert-parallel
    run holds a 1/dp share of the experts per GPU)."""
    config = simulation_config(run, recorded_blocks=False)
    if run.data_parallel_size > 1 and run.engine_kwargs.get("enable_expert_parallel"):
        d, e = config.deployment, config.engine
        return ep_kv_cache_blocks(d.model, d.gpu, run.data_parallel_size, e.block_size,
                                  d.gpu_memory_utilization, e.max_num_batched_tokens)
    return resolve_num_gpu_blocks(config)


def kv_sizing_error(run: RealRun) -> float | None:
    """(servesim - recorded) / recorded num_gpu_blocks, or None where the run records none."""
    recorded = run.recorded_blocks
    return None if recorded is None else (sized_gpu_blocks(run) - recorded) / recorded
