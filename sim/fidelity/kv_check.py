"""servesim's sized KV cache (`num_gpu_blocks`) against what a real run recorded.

vLLM states its KV size at start-up: V1 logs "GPU KV cache size: N tokens" (N = num_gpu_blocks x
block_size), older engines "# GPU blocks: N"; a run may also store `num_gpu_blocks` in its meta.json
(top level, or under `engine_kwargs` / `cache_config`). `recorded_gpu_blocks` finds any of these in a
run folder (meta.json and *.log / *.txt files); `kv_sizing_error` compares servesim's sizing with it.
The shared RTX PRO 6000 runs record none (their README), so the error there cannot be stated yet.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from kernels_cost_model.expert_parallel import ep_kv_cache_blocks
from sim.api.simulator import resolve_num_gpu_blocks

from .real_runs import RUN_DEFAULTS, RealRun
from .replay import simulation_config

_TOKENS = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")
_BLOCKS = re.compile(r"(?:# GPU blocks:|num_gpu_blocks\s*[=:])\s*([\d,]+)")


def blocks_from_log(text: str, block_size: int) -> int | None:
    """num_gpu_blocks from vLLM start-up log text (the last statement wins), or None."""
    blocks = [int(m.replace(",", "")) for m in _BLOCKS.findall(text)]
    if blocks:
        return blocks[-1]
    tokens = [int(m.replace(",", "")) for m in _TOKENS.findall(text)]
    return tokens[-1] // block_size if tokens else None


def blocks_from_meta(meta: dict) -> int | None:
    for where in (meta, meta.get("engine_kwargs") or {}, meta.get("cache_config") or {}):
        for key in ("num_gpu_blocks", "num_gpu_blocks_override"):
            if where.get(key) is not None:
                return int(where[key])
    return None


def recorded_gpu_blocks(run_dir: str | Path, block_size: int = RUN_DEFAULTS["block_size"]) -> int | None:
    """The num_gpu_blocks a run folder records (meta.json, then logs), or None."""
    run_dir = Path(run_dir)
    meta_path = run_dir / "meta.json"
    if meta_path.is_file() and (found := blocks_from_meta(json.loads(meta_path.read_text()))) is not None:
        return found
    for path in sorted(run_dir.glob("*.log")) + sorted(run_dir.glob("*.txt")):
        if (found := blocks_from_log(path.read_text(errors="replace"), block_size)) is not None:
            return found
    return None


def sized_gpu_blocks(run: RealRun) -> int:
    """num_gpu_blocks servesim sizes for one engine of the run, as its replay does (a DP + expert-parallel
    run holds a 1/dp share of the experts per GPU)."""
    config = simulation_config(run)
    if run.data_parallel_size > 1 and run.engine_kwargs.get("enable_expert_parallel"):
        d, e = config.deployment, config.engine
        return ep_kv_cache_blocks(d.model, d.gpu, run.data_parallel_size, e.block_size,
                                  d.gpu_memory_utilization, e.max_num_batched_tokens)
    return resolve_num_gpu_blocks(config)


def kv_sizing_error(run: RealRun) -> float | None:
    """(servesim - recorded) / recorded num_gpu_blocks, or None where the run records none."""
    recorded = recorded_gpu_blocks(run.path)
    return None if recorded is None else (sized_gpu_blocks(run) - recorded) / recorded
