"""KV-cache sizing against hand arithmetic."""
import pytest

from kernels_cost_model import kv_bytes_per_token, kv_cache_blocks
from kernels_cost_model.kv_memory import (NON_TORCH_BYTES_ONE_GPU, NON_TORCH_BYTES_PARALLEL, SAMPLER_BYTES_PER_LOGIT,
                                         activation_bytes, kv_cache_memory_bytes, non_torch_bytes, total_memory_bytes)
from kernels_cost_model.errors import ConfigError


def test_kv_bytes_per_token_llama_3_1_8b():
    # 2 (K, V) x 32 layers x 8 KV heads x 128 head_dim x 2 bytes = 128 KiB per token
    assert kv_bytes_per_token("llama-3.1-8b") == 131072
    assert kv_bytes_per_token("llama-3.1-8b", 2) == 65536
    assert kv_bytes_per_token("llama-3.1-8b", 8) == 16384
    # more GPUs than KV heads: heads are replicated, each GPU keeps one
    assert kv_bytes_per_token("qwen2.5-7b", 8) == 2 * 28 * 1 * 128 * 2
    assert kv_bytes_per_token("llama-2-7b") == 2 * 32 * 32 * 128 * 2


def test_num_gpu_blocks_llama_3_1_8b_on_h100():
    total = 85_017_493_504 * 0.9   # what CUDA reports for an H100 80GB (79.18 GiB), not 80 GiB
    weights = 8_030_261_248 * 2   # parameters x bf16
    t, seqs = 8192, 256
    # the sampler pass over 256 rows of logits dominates the forward pass's widest tensors
    activations = int(t * 4096 * 2 + SAMPLER_BYTES_PER_LOGIT * seqs * 128256)
    free = total - weights - activations - NON_TORCH_BYTES_ONE_GPU
    expected = int(free // (16 * 131072))
    assert kv_cache_blocks("llama-3.1-8b", "h100") == expected
    assert 25_000 < expected < 30_000  # ~ what vLLM reports for this setup (about 450k tokens)


def test_memory_terms():
    assert total_memory_bytes("h100") < 80 * 2**30                   # CUDA's total, not the datasheet's
    assert total_memory_bytes("h200") == 150_109_880_320              # CUDA's (139.80 GiB), not 141 GiB
    assert total_memory_bytes("l40s") == 48 * 2**30                 # datasheet where CUDA's is unknown
    assert non_torch_bytes(1) == NON_TORCH_BYTES_ONE_GPU < non_torch_bytes(2) == NON_TORCH_BYTES_PARALLEL
    # more sampler rows, more activation memory; fewer tokens than seqs cap the rows
    assert activation_bytes("llama-3.1-8b", 1, 8192, 1024) > activation_bytes("llama-3.1-8b", 1, 8192, 256)
    assert activation_bytes("llama-3.1-8b", 1, 16, 1024) == activation_bytes("llama-3.1-8b", 1, 16, 16)
    # CUDA-graph memory comes out of the KV cache byte for byte
    base = kv_cache_memory_bytes("llama-3.1-8b", "h100")
    assert kv_cache_memory_bytes("llama-3.1-8b", "h100", cudagraph_memory_bytes=2**30) == base - 2**30
    graphs = kv_cache_blocks("llama-3.1-8b", "h100", cudagraph_memory_bytes=2**30)
    assert graphs < kv_cache_blocks("llama-3.1-8b", "h100")


def test_blocks_scale_with_utilisation_block_size_and_tp():
    base = kv_cache_blocks("llama-3.1-70b", "h100", 4)
    assert kv_cache_blocks("llama-3.1-70b", "h100", 4, gpu_memory_utilization=0.95) > base
    assert kv_cache_blocks("llama-3.1-70b", "h100", 4, block_size=32) == pytest.approx(base / 2, abs=1)
    assert kv_cache_blocks("llama-3.1-70b", "h100", 8) > 2 * base


def test_model_that_does_not_fit_is_a_clear_error():
    with pytest.raises(ConfigError) as err:
        kv_cache_blocks("llama-3.1-70b", "l4")
    assert err.value.field == "gpu" and "no room for a KV cache" in str(err.value)


@pytest.mark.parametrize("kwargs,field", [(dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
                                          (dict(block_size=0), "block_size"),
                                          (dict(tensor_parallel_size=3), "tensor_parallel_size")])
def test_bad_arguments(kwargs, field):
    with pytest.raises(ConfigError) as err:
        kv_cache_blocks("llama-3.1-8b", "h100", **kwargs)
    assert err.value.field == field


def test_pinned_num_gpu_blocks():
    assert kv_cache_blocks("llama-3.1-70b", "l4", num_gpu_blocks=1234) == 1234
    with pytest.raises(ConfigError) as err:
        kv_cache_blocks("llama-3.1-8b", "h100", num_gpu_blocks=0)
    assert err.value.field == "num_gpu_blocks"


@pytest.mark.parametrize("kwargs, field", [
    (dict(tensor_parallel_size=0), "tensor_parallel_size"), (dict(tensor_parallel_size=True), "tensor_parallel_size"),
    (dict(tensor_parallel_size="2"), "tensor_parallel_size"), (dict(block_size=True), "block_size"),
    (dict(gpu_memory_utilization="0.9"), "gpu_memory_utilization"),
    (dict(max_num_batched_tokens=1.5), "max_num_batched_tokens"),
    (dict(max_num_batched_tokens=float("inf")), "max_num_batched_tokens"),
    (dict(max_num_seqs=0), "max_num_seqs"), (dict(num_gpu_blocks=True), "num_gpu_blocks"),
])
def test_kv_cache_blocks_names_a_bad_argument(kwargs, field):
    with pytest.raises(ConfigError) as err:
        kv_cache_blocks("llama-3.1-8b", "h100", **kwargs)
    assert err.value.field == field and err.value.value is next(iter(kwargs.values()))
