"""KV-cache sizing, the way vLLM sizes its cache (its worker's memory profiling at start-up).

bytes per token per GPU = 2 (K and V) x layers x KV heads on this GPU x head_dim x dtype bytes.
num_gpu_blocks = floor((total memory x gpu_memory_utilization - weights per GPU - activation peak
                        - non-torch memory - CUDA-graph memory) / (block_size x bytes per token)).
Total memory is what CUDA reports (a little under the datasheet's) where known. The activation peak
is vLLM's profiling run: a forward pass of `max_num_batched_tokens` tokens, then a sampler pass over
`max_num_seqs` rows of logits, which dominates for every catalog model.

Checked against vLLM's own start-up logs (llm-d/llm-d-benchmark,
config_explorer/empirical-vllm-memory-results.md, H100, 79.18 GiB, gpu_memory_utilization 0.9):
available KV cache Llama-3.1-8B 51.38 GiB, Qwen3-32B 4.45 GiB, gpt-oss-20b 50.28 GiB
(tests/test_kv_sizing_vllm.py). MXFP4 expert weights are held as vLLM's MoE backend for the GPU lays
them out (mxfp4_layout.py), which is what its "Model loading took" lines show.
"""
from __future__ import annotations

from kernels_cost_model.errors import ConfigError, is_int, is_number, require

from .hardware import get_gpu
from .kv_layout import KVCacheLayout, hybrid_block_size, kv_cache_layout
from .model_shapes import split_params
from .models import get_model
from .mxfp4_layout import backend_for, expert_bytes

GIB = 1 << 30
#: Total memory as CUDA reports it (torch.cuda.mem_get_info, what vLLM's profiling reads), below the
#: datasheet's. servesim's own reading on the GPU (2026-11-26, driver 580.159.04, torch 2.11.0+cu130, CUDA
#: 13.0; nvidia-smi shows a little more, 81,559 and 143,771 MiB):
#: H100 SXM 80GB 85,017,493,504 bytes (79.18 GiB, as vLLM's logs: llm-d/llm-d-benchmark,
#: empirical-vllm-memory-results.md); H200 150,109,880,320 bytes (139.80 GiB, not the datasheet's 141 GB).
CUDA_TOTAL_BYTES = {"h100-sxm": 85_017_493_504, "h200": 150_109_880_320}
#: Memory outside PyTorch's allocator (CUDA context, NCCL): vLLM's "non-torch memory" in the same
#: logs: 0.13-0.14 GiB on one GPU, 0.55 GiB per GPU at tensor_parallel_size 2 (NCCL buffers).
NON_TORCH_BYTES_ONE_GPU = round(0.13 * GIB)
NON_TORCH_BYTES_PARALLEL = round(0.55 * GIB)
#: Peak bytes of the sampler's profiling pass per logit (row x vocabulary entry): the fp32 logits
#: and the sort, softmax and cumulative-sum copies top-k/top-p sampling makes of them. Fitted to the
#: same logs' peak activation (Llama-3.1-8B 4.76, Qwen3-32B 5.64, gpt-oss-20b 7.38, Qwen3-0.6B 5.56 GiB
#: at vLLM's H100 defaults max_num_seqs 1024, max_num_batched_tokens 8192; 38.3-38.6 each).
SAMPLER_BYTES_PER_LOGIT = 38.4


def _kv_heads_per_gpu(spec, tp: int) -> int:
    require(is_int(tp) and tp >= 1, "tensor_parallel_size", tp, "must be an integer >= 1")
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


def kv_block_size(model, tensor_parallel_size: int = 1, block_size: int = 16, kv_cache_dtype: str = "auto",
                  release: str = "0.33") -> int:
    """The block size vLLM `release` runs `model` at when asked for `block_size`: raised for a model with
    linear-attention state until one page holds a state (kv_layout.hybrid_block_size), else unchanged."""
    spec = get_model(model)
    return hybrid_block_size(spec, _kv_heads_per_gpu(spec, tensor_parallel_size), tensor_parallel_size,
                             block_size, kv_cache_dtype, release)


def weight_bytes_per_gpu(model, tensor_parallel_size: int = 1, gpu=None) -> int:
    """Weight bytes on each GPU. MXFP4 experts take what vLLM's MoE backend for `gpu` lays out
    (mxfp4_layout.py); without a GPU, the checkpoint's bytes."""
    spec, tp = get_model(model), tensor_parallel_size
    if spec.is_plain:
        return spec.num_params() * spec.dtype_bytes // tp
    if spec.quant_method != "mxfp4" or gpu is None:
        return int(spec.weight_bytes_total()) // tp
    return mxfp4_weight_bytes(spec, tp, backend_for(get_gpu(gpu)))


def mxfp4_weight_bytes(spec, tp: int, backend) -> int:
    """Weights per GPU of an MXFP4-expert model laid out by `backend` (mxfp4_layout.py)."""
    dense, _ = split_params(spec)
    moe_layers = spec.num_layers - spec.first_k_dense_replace
    experts = moe_layers * spec.num_experts * expert_bytes(spec.hidden_size, spec.moe_intermediate_size // tp,
                                                           backend)
    return int(dense * (spec.weight_bytes or spec.dtype_bytes)) // tp + experts


def total_memory_bytes(gpu) -> int:
    """A GPU's total memory as CUDA reports it where known, else the datasheet's (data/gpus.csv)."""
    hw = get_gpu(gpu)
    return CUDA_TOTAL_BYTES.get(hw.name, hw.memory_bytes)


def non_torch_bytes(tensor_parallel_size: int = 1) -> int:
    """Memory outside PyTorch's allocator per GPU; more once NCCL runs collectives."""
    return NON_TORCH_BYTES_ONE_GPU if tensor_parallel_size == 1 else NON_TORCH_BYTES_PARALLEL


def activation_bytes(model, tensor_parallel_size: int = 1, max_num_batched_tokens: int = 8192,
                     max_num_seqs: int = 256) -> int:
    """Peak activation memory of vLLM's profiling run: the larger of the forward pass (widest live
    tensors of one layer) and the sampler pass (its logits while the hidden states stay alive)."""
    spec, t = get_model(model), max_num_batched_tokens
    hidden = t * spec.hidden_size * spec.dtype_bytes
    sampler = SAMPLER_BYTES_PER_LOGIT * min(max_num_seqs, t) * spec.vocab_size  # logits are gathered whole
    return int(max(_forward_bytes(spec, tensor_parallel_size, t), hidden + sampler))


def forward_activation_bytes(model, tensor_parallel_size: int = 1, max_num_batched_tokens: int = 8192) -> int:
    """Peak activation memory of the profiling run's forward pass alone (a pipeline stage before the
    last, which runs no sampler)."""
    return int(_forward_bytes(get_model(model), tensor_parallel_size, max_num_batched_tokens))


def _forward_bytes(spec, tp: int, tokens: int) -> int:
    """The widest live tensors of one layer for `tokens` tokens."""
    inter = (spec.moe_intermediate_size * spec.num_experts_per_tok if spec.is_moe else spec.intermediate_size)
    per_token = 4 * spec.hidden_size + (spec.q_dim + 2 * spec.kv_dim) // tp + 3 * inter // tp
    return tokens * per_token * spec.dtype_bytes


def kv_cache_memory_bytes(model, gpu, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.9,
                          max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
                          cudagraph_memory_bytes: int = 0) -> int:
    """Bytes per GPU left for the KV cache (vLLM's "Available KV cache memory"); may be <= 0."""
    spec = get_model(model)
    budget = total_memory_bytes(gpu) * gpu_memory_utilization
    used = (weight_bytes_per_gpu(spec, tensor_parallel_size, gpu)
            + activation_bytes(spec, tensor_parallel_size, max_num_batched_tokens, max_num_seqs)
            + non_torch_bytes(tensor_parallel_size) + cudagraph_memory_bytes)
    return int(budget - used)


def kv_cache_blocks(model, gpu, tensor_parallel_size: int = 1, block_size: int = 16,
                    gpu_memory_utilization: float = 0.9, max_num_batched_tokens: int = 8192,
                    num_gpu_blocks: int | None = None, kv_cache_dtype: str = "auto", *,
                    max_num_seqs: int = 256, cudagraph_memory_bytes: int = 0, hybrid_manager: bool = True) -> int:
    """KV blocks per GPU that fit beside weights and activations (vLLM's `num_gpu_blocks`).

    A user who pins `num_gpu_blocks` (vLLM's `num_gpu_blocks_override`) gets it back, validated.
    `hybrid_manager=False`: vLLM's hybrid KV cache manager is off, so a hybrid model's pool block holds
    a page of every layer (KVCacheLayout.all_full; a named error for linear-attention state).
    """
    if num_gpu_blocks is not None:
        require(is_int(num_gpu_blocks) and num_gpu_blocks >= 1, "num_gpu_blocks", num_gpu_blocks,
                "must be an integer >= 1")
        return num_gpu_blocks
    _check_sizing(tensor_parallel_size, block_size, gpu_memory_utilization, max_num_batched_tokens,
                  max_num_seqs, cudagraph_memory_bytes)
    hw, spec = get_gpu(gpu), get_model(model)
    _kv_heads_per_gpu(spec, tensor_parallel_size)
    free = kv_cache_memory_bytes(spec, hw.name, tensor_parallel_size, gpu_memory_utilization,
                                 max_num_batched_tokens, max_num_seqs, cudagraph_memory_bytes)
    if free <= 0:
        budget = total_memory_bytes(hw.name) * gpu_memory_utilization
        raise ConfigError("gpu", hw.name, f"{spec.name} at tensor_parallel_size={tensor_parallel_size} "
                          f"needs {(budget - free) / GIB:.1f} GiB but gpu_memory_utilization={gpu_memory_utilization} "
                          f"leaves {budget / GIB:.1f} GiB: no room for a KV cache (its activation peak, "
                          f"{activation_bytes(spec, tensor_parallel_size, max_num_batched_tokens, max_num_seqs) / GIB:.1f}"
                          f" GiB, is vLLM's profiling pass at max_num_seqs={max_num_seqs} and max_num_batched_tokens="
                          f"{max_num_batched_tokens}: fewer shrink it)")
    if spec.is_plain and kv_cache_dtype == "auto":
        return int(free // (block_size * kv_bytes_per_token(spec, tensor_parallel_size)))
    layout = kv_layout(spec, tensor_parallel_size, block_size, kv_cache_dtype)
    return int(free // (layout if hybrid_manager else layout.all_full()).block_bytes)


def _check_sizing(tp, block_size, gpu_memory_utilization, max_num_batched_tokens, max_num_seqs,
                  cudagraph_memory_bytes) -> None:
    """kv_cache_blocks' numeric arguments: types and ranges, each named."""
    require(is_int(tp) and tp >= 1, "tensor_parallel_size", tp, "must be an integer >= 1")
    require(is_int(block_size) and block_size >= 1, "block_size", block_size, "must be an integer >= 1")
    require(is_number(gpu_memory_utilization) and 0.0 < gpu_memory_utilization <= 1.0, "gpu_memory_utilization",
            gpu_memory_utilization, "must be in (0, 1]")
    require(is_int(max_num_batched_tokens) and max_num_batched_tokens >= 1, "max_num_batched_tokens",
            max_num_batched_tokens, "must be an integer >= 1")
    require(is_int(max_num_seqs) and max_num_seqs >= 1, "max_num_seqs", max_num_seqs, "must be an integer >= 1")
    require(is_number(cudagraph_memory_bytes) and cudagraph_memory_bytes >= 0, "cudagraph_memory_gib",
            cudagraph_memory_bytes / GIB if is_number(cudagraph_memory_bytes) else cudagraph_memory_bytes,
            "must be >= 0")
