"""The decoder layers on each pipeline stage, as vLLM deals them.

vLLM's `get_pp_indices` (vllm/distributed/utils.py) gives every stage num_layers // PP layers and one
more each to the stages before the last (stages -2, -3, ...) for the remainder: the last stage, which
also runs the final norm, the LM head and the sampler, never takes an extra layer, and at PP 2 an odd
layer goes to the first stage. Its `VLLM_PP_LAYER_PARTITION` environment variable (comma-separated layer
counts, one per stage, adding up to the model's layers) overrides the rule: `layer_partition` here.
"""
from __future__ import annotations

from kernels_cost_model.errors import is_int, require


def layer_partition(num_layers: int, pipeline_parallel_size: int,
                    override: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Layers on each stage, as vLLM's `get_pp_indices` deals them (or `override`, validated)."""
    if override is not None:
        check_layer_partition(override, pipeline_parallel_size, num_layers)
        return tuple(int(n) for n in override)
    per_stage, extra = divmod(num_layers, pipeline_parallel_size)
    stages = [per_stage] * pipeline_parallel_size
    for back in range(2, extra + 2):   # stages -2, -3, ...: never the last one
        stages[-back] += 1
    return tuple(stages)


def check_layer_partition(partition, pipeline_parallel_size: int, num_layers: int | None = None) -> None:
    """`layer_partition` (vLLM's VLLM_PP_LAYER_PARTITION): PP entries >= 1 summing to num_layers (not
    checked without a model: `num_layers` None)."""
    require(isinstance(partition, (tuple, list)) and all(is_int(n) and n >= 1 for n in partition),
            "layer_partition", partition, "must be a sequence of integers >= 1 (layers per stage)")
    require(len(partition) == pipeline_parallel_size, "layer_partition", tuple(partition),
            f"has {len(partition)} entries; pipeline_parallel_size={pipeline_parallel_size} needs one per stage")
    require(num_layers is None or sum(partition) == num_layers, "layer_partition", tuple(partition),
            f"adds up to {sum(partition)} layers; the model has num_layers={num_layers}")
