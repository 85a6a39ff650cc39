"""KV sizing against vLLM's own start-up logs.

Source: llm-d/llm-d-benchmark, config_explorer/empirical-vllm-memory-results.md (commit 2593348):
vLLM on one H100 80GB (CUDA reports 79.18 GiB), gpu_memory_utilization 0.9, vLLM's H100 defaults
max_num_seqs 1024 and max_num_batched_tokens 8192. "Available KV cache memory" per model below.
"""
import pytest

from kernels_cost_model.kv_memory import GIB, kv_cache_memory_bytes

VLLM_LOG_KV_GIB = [("llama-3.1-8b", 51.38, 0.005), ("qwen3-32b", 4.45, 0.01), ("gpt-oss-20b", 50.28, 0.02)]


@pytest.mark.parametrize("model,logged_gib,tolerance", VLLM_LOG_KV_GIB)
def test_available_kv_memory_matches_vllm_log(model, logged_gib, tolerance):
    ours = kv_cache_memory_bytes(model, "h100", 1, 0.9, max_num_batched_tokens=8192, max_num_seqs=1024) / GIB
    assert ours == pytest.approx(logged_gib, rel=tolerance)
