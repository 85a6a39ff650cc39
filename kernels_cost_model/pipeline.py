"""Pipeline-parallel pricing: the layers of each stage, activations sent between stages, KV per stage.

A model of `num_layers` layers on `pipeline_parallel_size` stages takes vLLM's partition
(vllm/distributed/utils.py `get_pp_indices`): num_layers // PP layers on every stage, the remainder
one more each on the stages before the last (the last, which also runs the final norm, the LM head
and the sampler, never takes one); `VLLM_PP_LAYER_PARTITION` (here `layer_partition`) overrides it.
Between stages a batch sends each token's hidden state (hidden_size x dtype bytes per token) over the
link. Each stage holds its layers' weights and the embedding or head it owns (stage_weights.py) and
its layers' KV; its free memory gives its own block count, and every stage takes the fewest
(`pipeline_kv_cache_blocks`). A batch's seconds on each stage: stage_times.py.
"""
from __future__ import annotations

from kernels_cost_model.errors import ConfigError, is_int, require

from .architectures import ends_on_every_stage
from .hardware import get_gpu
from .kv_layout import stage_group_sizes
from .layer_partition import layer_partition
from .kv_memory import (GIB, activation_bytes, forward_activation_bytes, kv_bytes_per_token, kv_layout,
                        non_torch_bytes, total_memory_bytes)
from .links import Link
from .models import get_model
from .stage_weights import stage_weight_bytes


def check_pipeline_size(model, pipeline_parallel_size: int,
                        partition: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The layers on each stage; PP must be an integer in 1..num_layers (vLLM places an uneven
    remainder itself), `partition` a valid override."""
    spec = get_model(model)
    require(is_int(pipeline_parallel_size) and pipeline_parallel_size >= 1, "pipeline_parallel_size",
            pipeline_parallel_size, "must be an integer >= 1")
    require(pipeline_parallel_size <= spec.num_layers, "pipeline_parallel_size", pipeline_parallel_size,
            f"must be at most num_layers={spec.num_layers} of {spec.name} (every stage holds a layer)")
    return layer_partition(spec.num_layers, pipeline_parallel_size, partition)


def stage_send_time_s(model, num_tokens: int, link: Link, tensor_parallel_size: int = 1) -> float:
    """One stage-to-stage send of `num_tokens` hidden states (each TP rank sends its share)."""
    spec = get_model(model)
    return link.transfer_time_s(num_tokens * spec.hidden_size * spec.dtype_bytes, tensor_parallel_size)


def stage_block_bytes(model, tensor_parallel_size: int, partition: tuple[int, ...], block_size: int = 16,
                      kv_cache_dtype: str = "auto", hybrid_manager: bool = True) -> tuple[int, ...]:
    """Bytes of one pool block on each stage: its layers' pages, or with vLLM's hybrid manager on a
    hybrid model its fullest group's pages there (kv_layout.stage_group_sizes)."""
    spec, tp = get_model(model), tensor_parallel_size
    layout = kv_layout(spec, tp, block_size, kv_cache_dtype) if not spec.is_plain else None
    if hybrid_manager and layout is not None and layout.is_hybrid:
        return tuple(layout.page_bytes * n for n in stage_group_sizes(spec, layout, partition))
    per_layer = kv_bytes_per_token(spec, tp, kv_cache_dtype) // spec.num_layers
    return tuple(block_size * per_layer * n for n in partition)


def stage_free_bytes(model, gpu, tensor_parallel_size: int, partition: tuple[int, ...],
                     gpu_memory_utilization: float = 0.9, max_num_batched_tokens: int = 8192,
                     max_num_seqs: int = 256, cudagraph_memory_bytes: int = 0) -> tuple[float, ...]:
    """Bytes each stage's GPUs leave for the KV cache: the budget less the stage's weights, its
    activation peak (only the last stage runs the sampler in vLLM's profiling run, gpu_model_runner
    `profile_run` / `_dummy_sampler_run`; the others peak in the forward pass), non-torch memory and
    CUDA-graph memory: `cudagraph_memory_bytes` is one figure per GPU (the user's), taken from every
    stage alike (vLLM's per-rank graphs over each rank's layers are not estimated). May be <= 0."""
    hw, spec, tp, pp = get_gpu(gpu), get_model(model), tensor_parallel_size, len(partition)
    budget = total_memory_bytes(hw.name) * gpu_memory_utilization
    weights = stage_weight_bytes(spec, tp, hw.name, partition)
    last = activation_bytes(spec, tp, max_num_batched_tokens, max_num_seqs)
    forward = forward_activation_bytes(spec, tp, max_num_batched_tokens)
    fixed = non_torch_bytes(tp * pp) + cudagraph_memory_bytes
    return tuple(budget - (w + (last if i == pp - 1 else forward) + fixed) for i, w in enumerate(weights))


def pipeline_kv_cache_blocks(model, gpu, tensor_parallel_size: int, pipeline_parallel_size: int,
                             block_size: int = 16, gpu_memory_utilization: float = 0.9,
                             max_num_batched_tokens: int = 8192, max_num_seqs: int = 256, *,
                             kv_cache_dtype: str = "auto", cudagraph_memory_bytes: int = 0,
                             hybrid_manager: bool = True, layer_partition: tuple[int, ...] | None = None) -> int:
    """KV blocks of a TP x PP deployment: each stage's free memory over its own block bytes, and the
    fewest of any stage for all (vLLM takes the fewest blocks of any worker: 0.19.1 kv_cache_utils.py,
    0.33.0 kv_cache_planning.py `get_kv_cache_configs`). `layer_partition`: vLLM's
    VLLM_PP_LAYER_PARTITION (None: its default partition). `kv_cache_dtype`, `cudagraph_memory_bytes`:
    as `kv_cache_blocks`'s; `hybrid_manager`: as `stage_block_bytes`'s."""
    blocks = stage_kv_cache_blocks(model, gpu, tensor_parallel_size, pipeline_parallel_size, block_size,
                                   gpu_memory_utilization, max_num_batched_tokens, max_num_seqs,
                                   kv_cache_dtype=kv_cache_dtype, cudagraph_memory_bytes=cudagraph_memory_bytes,
                                   hybrid_manager=hybrid_manager, layer_partition=layer_partition)
    return min(blocks)


def stage_kv_cache_blocks(model, gpu, tensor_parallel_size: int, pipeline_parallel_size: int,
                          block_size: int = 16, gpu_memory_utilization: float = 0.9,
                          max_num_batched_tokens: int = 8192, max_num_seqs: int = 256, *,
                          kv_cache_dtype: str = "auto", cudagraph_memory_bytes: int = 0,
                          hybrid_manager: bool = True, layer_partition: tuple[int, ...] | None = None
                          ) -> tuple[int, ...]:
    """The blocks each stage's memory holds (`pipeline_kv_cache_blocks` takes the fewest); a stage
    with no room is a named error that says which stage."""
    spec, tp, hw = get_model(model), tensor_parallel_size, get_gpu(gpu)
    partition = check_pipeline_size(spec, pipeline_parallel_size, layer_partition)
    free = stage_free_bytes(spec, hw.name, tp, partition, gpu_memory_utilization, max_num_batched_tokens,
                            max_num_seqs, cudagraph_memory_bytes)
    for stage, room in enumerate(free):
        if room <= 0:
            raise ConfigError("gpu", hw.name, f"{spec.name} at TP{tp} x PP{pipeline_parallel_size}: stage "
                              f"{stage} ({_stage_label(spec, partition, stage)}) needs {-room / GIB:.1f} GiB more than "
                              f"gpu_memory_utilization={gpu_memory_utilization} leaves: no room for a KV cache")
    sizes = stage_block_bytes(spec, tp, partition, block_size, kv_cache_dtype, hybrid_manager)
    return tuple(int(room // size) for room, size in zip(free, sizes))


def _stage_label(spec, partition: tuple[int, ...], stage: int) -> str:
    """'layers 0-39, the embedding' / 'layers 40-79, the final norm and LM head' (both on every stage of an
    architecture whose vLLM class builds them on every rank: architectures.py)."""
    start = sum(partition[:stage])
    every = ends_on_every_stage(spec.architecture)
    ends = (["the embedding"] * (every or stage == 0)
            + ["the final norm and LM head"] * (every or stage == len(partition) - 1))
    return ", ".join([f"layers {start}-{start + partition[stage] - 1}", *ends])
