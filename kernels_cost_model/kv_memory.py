"""KV-cache sizing, the way vLLM sizes its cache.

bytes per token per GPU = 2 (K and V) x layers x KV heads on this GPU x head_dim x dtype bytes.
num_gpu_blocks = floor((memory x gpu_memory_utilization - weights per GPU - activation peak
                        - non-torch reserve) / (block_size x bytes per token)).
The activation peak is vLLM's profiling forward pass of `max_num_batched_tokens` tokens; we estimate
it from the widest live tensors of one layer plus the sampler's fp32 logits.
"""
from __future__ import annotations

from kernels_cost_model.errors import ConfigError, require

from .hardware import get_gpu
from .kv_layout import KVCacheLayout, kv_cache_layout
from .models import get_model

#: CUDA context, NCCL buffers and CUDA graphs outside PyTorch's allocator (assumed, ~vLLM's logs).
NON_TORCH_RESERVE_BYTES = 1 << 30
#: Requests the sampler's dummy run produces logits for (vLLM's default max_num_seqs).
SAMPLER_ROWS = 256


def _kv_heads_per_gpu(spec, tp: int) -> int:
    require(isinstance(tp, int) and tp >= 1, "tensor_parallel_size", tp, "must be an integer >= 1")
    require(spec.num_kv_heads % tp == 0 or tp % spec.num_kv_heads == 0, "tensor_parallel_size", tp,
            f"must divide or be a multiple of num_kv_heads={spec.num_kv_heads} of {spec.name}")
    return max(1, spec.num_kv_heads // tp)  # below one head per GPU, heads are replicated


def kv_bytes_per_token(model, tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto") -> int:
    """KV-cache bytes one token occupies on each GPU if every layer kept all its tokens."""
    spec = get_model(model)
    kv = _kv_heads_per_gpu(spec, tensor_parallel_size)
    if spec.is_plain and kv_cache_dtype == "auto":
        return 2 * spec.num_layers * kv * spec.head_dim * spec.dtype_bytes
    layout = kv_layout(spec, tensor_parallel_size, 1, kv_cache_dtype)
    return layout.page_bytes * spec.num_layers


def kv_layout(model, tensor_parallel_size: int = 1, block_size: int = 16,
              kv_cache_dtype: str = "auto") -> KVCacheLayout:
    """Layer groups and pool block bytes of `model` on one GPU (kv_layout.py)."""
    spec = get_model(model)
    return kv_cache_layout(spec, _kv_heads_per_gpu(spec, tensor_parallel_size), tensor_parallel_size,
                           block_size, kv_cache_dtype)


def weight_bytes_per_gpu(model, tensor_parallel_size: int = 1) -> int:
    spec = get_model(model)
    if spec.is_plain:
        return spec.num_params() * spec.dtype_bytes // tensor_parallel_size
    return int(spec.weight_bytes_total()) // tensor_parallel_size


def activation_bytes(model, tensor_parallel_size: int = 1, max_num_batched_tokens: int = 8192) -> int:
    """Peak activation memory of the profiling forward pass (estimate)."""
    spec, tp, t = get_model(model), tensor_parallel_size, max_num_batched_tokens
    inter = (spec.moe_intermediate_size * spec.num_experts_per_tok if spec.is_moe else spec.intermediate_size)
    per_token = 4 * spec.hidden_size + (spec.q_dim + 2 * spec.kv_dim) // tp + 3 * inter // tp
    logits = min(SAMPLER_ROWS, t) * spec.vocab_size // tp * 4
    return t * per_token * spec.dtype_bytes + logits


def kv_cache_blocks(model, gpu, tensor_parallel_size: int = 1, block_size: int = 16,
                    gpu_memory_utilization: float = 0.9, max_num_batched_tokens: int = 8192,
                    num_gpu_blocks: int | None = None, kv_cache_dtype: str = "auto") -> int:
    """KV blocks per GPU that fit beside weights and activations (vLLM's `num_gpu_blocks`).

    A user who pins `num_gpu_blocks` (vLLM's `num_gpu_blocks_override`) gets it back, validated.
    """
    if num_gpu_blocks is not None:
        require(isinstance(num_gpu_blocks, int) and num_gpu_blocks >= 1, "num_gpu_blocks", num_gpu_blocks,
                "must be an integer >= 1")
        return num_gpu_blocks
    require(isinstance(block_size, int) and block_size >= 1, "block_size", block_size, "must be an integer >= 1")
    require(0.0 < gpu_memory_utilization <= 1.0, "gpu_memory_utilization", gpu_memory_utilization,
            "must be in (0, 1]")
    require(max_num_batched_tokens >= 1, "max_num_batched_tokens", max_num_batched_tokens, "must be >= 1")
    hw, spec = get_gpu(gpu), get_model(model)
    budget = hw.memory_bytes * gpu_memory_utilization
    used = (weight_bytes_per_gpu(spec, tensor_parallel_size)
            + activation_bytes(spec, tensor_parallel_size, max_num_batched_tokens) + NON_TORCH_RESERVE_BYTES)
    free = budget - used
    if free <= 0:
        raise ConfigError("gpu", hw.name, f"{spec.name} at tensor_parallel_size={tensor_parallel_size} "
                          f"needs {used / 2**30:.1f} GiB but gpu_memory_utilization={gpu_memory_utilization} "
                          f"leaves {budget / 2**30:.1f} GiB: no room for a KV cache")
    if spec.is_plain and kv_cache_dtype == "auto":
        return int(free // (block_size * kv_bytes_per_token(spec, tensor_parallel_size)))
    return int(free // kv_layout(spec, tensor_parallel_size, block_size, kv_cache_dtype).block_bytes)
