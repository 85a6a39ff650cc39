"""Pipeline-parallel pricing: stages over layers, activations sent between stages, KV per stage.

A model of `num_layers` layers on `pipeline_parallel_size` stages puts num_layers / PP layers on each
stage (vLLM splits evenly; a size that does not divide the layers is a named error here). A batch's
stage time is the whole model's step time / PP; between stages it sends each token's hidden state
(hidden_size x dtype bytes per token) over the link. Each GPU holds 1/PP of the weights and of
every token's KV, so the KV cache holds PP times the blocks of one GPU's share; with vLLM's hybrid
KV manager a stage's pool block holds its share of each layer group (kv_layout.stage_group_sizes).
"""
from __future__ import annotations

from kernels_cost_model.errors import ConfigError, require

from .hardware import get_gpu
from .kv_layout import stage_group_sizes
from .kv_memory import (activation_bytes, kv_bytes_per_token, kv_layout, non_torch_bytes, total_memory_bytes,
                        weight_bytes_per_gpu)
from .links import Link
from .models import get_model


def check_pipeline_size(model, pipeline_parallel_size: int) -> int:
    """The layers per stage; PP must be an integer >= 1 dividing the model's layers."""
    spec = get_model(model)
    require(isinstance(pipeline_parallel_size, int) and pipeline_parallel_size >= 1, "pipeline_parallel_size",
            pipeline_parallel_size, "must be an integer >= 1")
    if spec.num_layers % pipeline_parallel_size:
        raise ConfigError("pipeline_parallel_size", pipeline_parallel_size,
                          f"must divide num_layers={spec.num_layers} of {spec.name}")
    return spec.num_layers // pipeline_parallel_size


def stage_send_time_s(model, num_tokens: int, link: Link, tensor_parallel_size: int = 1) -> float:
    """One stage-to-stage send of `num_tokens` hidden states (each TP rank sends its share)."""
    spec = get_model(model)
    return link.transfer_time_s(num_tokens * spec.hidden_size * spec.dtype_bytes, tensor_parallel_size)


def pipeline_kv_cache_blocks(model, gpu, tensor_parallel_size: int, pipeline_parallel_size: int,
                             block_size: int = 16, gpu_memory_utilization: float = 0.9,
                             max_num_batched_tokens: int = 8192, max_num_seqs: int = 256, *,
                             kv_cache_dtype: str = "auto", cudagraph_memory_bytes: int = 0,
                             hybrid_manager: bool = True) -> int:
    """KV blocks of a TP x PP deployment: each GPU keeps 1/PP of the weights and of each token's KV. The
    activation peak is the last stage's, which samples (`max_num_seqs` rows of logits): the stage with
    the least room sets every stage's cache (vLLM takes the fewest blocks of any worker: 0.19.1
    kv_cache_utils.py, 0.33.0 kv_cache_planning.py `get_kv_cache_configs`). A hybrid model with
    `hybrid_manager` on gets the blocks its stage with the widest pool block leaves room for
    (kv_layout.stage_group_sizes); off, every layer is full attention. `kv_cache_dtype`,
    `cudagraph_memory_bytes`: as `kv_cache_blocks`'s."""
    check_pipeline_size(model, pipeline_parallel_size)
    hw, spec, pp = get_gpu(gpu), get_model(model), pipeline_parallel_size
    budget = total_memory_bytes(hw.name) * gpu_memory_utilization
    used = (weight_bytes_per_gpu(spec, tensor_parallel_size, hw.name) / pp
            + activation_bytes(spec, tensor_parallel_size, max_num_batched_tokens, max_num_seqs)
            + non_torch_bytes(tensor_parallel_size * pp) + cudagraph_memory_bytes)
    if budget <= used:
        raise ConfigError("gpu", hw.name, f"{spec.name} at TP{tensor_parallel_size} x PP{pp} leaves no room "
                                          f"for a KV cache at gpu_memory_utilization={gpu_memory_utilization}")
    layout = kv_layout(spec, tensor_parallel_size, block_size, kv_cache_dtype) if not spec.is_plain else None
    if hybrid_manager and layout is not None and layout.is_hybrid:
        return int((budget - used) // (layout.page_bytes * max(stage_group_sizes(spec, layout, pp))))
    return int((budget - used) // (block_size * kv_bytes_per_token(spec, tensor_parallel_size, kv_cache_dtype) / pp))
