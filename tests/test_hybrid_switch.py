"""Each topology runs a hybrid model as vLLM's start-up rule decides (sim.core.hybrid_switch): its
hybrid KV manager on, or every layer as full attention for scheduling and for sizing, or a named
error where vLLM (or servesim's CPU tier) cannot run it."""
import warnings

import pytest

from kernels_cost_model import kv_cache_blocks
from kernels_cost_model.errors import ConfigError
from sim.api.simulator import (SimulationConfig, kv_capacity_meta, resolve_kv_groups, resolve_kv_layout,
                               resolve_num_gpu_blocks)
from sim.core.hybrid_switch import NIXL, OFFLOADING
from sim.core.kv_groups import HybridKVCacheManager
from sim.planning.disagg import DisaggregatedCluster
from sim.planning.disagg_config import DisaggConfig, PoolConfig
from sim.planning.offload import OffloadConfig, simulate_offload


def _config(model="gpt-oss-20b", profile="vllm-0.19", **extra):
    return SimulationConfig.from_dict({"deployment": {"model": model, "gpu": "h100"},
                                       "engine": {"scheduler_profile": profile, "enable_prefix_caching": True,
                                                  "max_model_len": 8192},
                                       "workload": {"num_requests": 8, "rate": 20.0}, **extra})


def _all_full_blocks(config):
    d, e = config.deployment, config.engine
    return kv_cache_blocks(d.model, d.gpu, d.tensor_parallel_size, e.block_size, d.gpu_memory_utilization,
                           e.max_num_batched_tokens, max_num_seqs=e.resolved().max_num_seqs, hybrid_manager=False)


def test_a_cpu_tier_under_019_runs_and_sizes_every_layer_as_full_attention():
    config = _config()
    hybrid = resolve_num_gpu_blocks(config)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(understated|hybrid).*")
        results = simulate_offload(config, OffloadConfig(cpu_bytes=4e9))
    assert results.meta["num_gpu_blocks"] == _all_full_blocks(config) == resolve_num_gpu_blocks(config, (OFFLOADING,))
    assert 2 * results.meta["num_gpu_blocks"] in (hybrid, hybrid - 1)  # a pool block held half the layers
    assert results.requests["finish_reason"].notna().all()


def test_a_cpu_tier_under_033_keeps_the_hybrid_manager_which_the_tier_cannot_hold():
    with pytest.raises(ConfigError) as err:
        simulate_offload(_config(profile="vllm-0.33"), OffloadConfig(cpu_bytes=4e9))
    assert err.value.field == "offload.cpu_bytes" and "vLLM 0.33 keeps its hybrid KV cache manager" in err.value.reason


def test_a_linear_state_model_with_a_connector_under_019_is_refused_as_vllm_refuses():
    with pytest.raises(ConfigError) as err:
        simulate_offload(_config("qwen3-next-80b-a3b"), OffloadConfig(cpu_bytes=4e9))
    assert err.value.field == "engine.scheduler_profile" and err.value.value == "vllm-0.19"
    assert "refuses to start" in err.value.reason


def test_a_plain_model_is_sized_as_before_with_any_connector():
    config = _config("llama-3.1-8b")
    assert resolve_num_gpu_blocks(config, (NIXL, OFFLOADING)) == resolve_num_gpu_blocks(config)


@pytest.mark.parametrize("profile, hybrid", [("vllm-0.19", False), ("vllm-0.33", True)])
def test_disaggregated_pools_follow_the_release(profile, hybrid):
    config = _config(profile=profile)
    cluster = DisaggregatedCluster(config, DisaggConfig(PoolConfig(1), PoolConfig(1)))
    for engine in (cluster.prefill[0], cluster.decode[0]):
        assert isinstance(engine.state.kv, HybridKVCacheManager) == hybrid
    if not hybrid:
        assert cluster.decode[0].state.kv.num_gpu_blocks == _all_full_blocks(config)


@pytest.mark.parametrize("profile", ["vllm-0.19", "vllm-0.33"])
def test_chunked_local_attention_with_eagle_runs_every_layer_as_full_attention(profile):
    base = SimulationConfig.from_dict({"deployment": {"model": "llama-4-scout", "gpu": "h200",
                                                      "tensor_parallel_size": 2},
                                       "engine": {"scheduler_profile": profile, "max_model_len": 32768}})
    assert resolve_kv_groups(base) is not None
    spec = base.replace(speculative_config={"method": "eagle3", "num_speculative_tokens": 3})
    assert resolve_kv_groups(spec) is None
    layout = resolve_kv_layout(spec)
    meta = kv_capacity_meta(spec, 10_000)
    assert meta["max_concurrency"] == 10_000 / (32768 // 16) and layout.tokens(10_000) == 160_000
    ngram = base.replace(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert resolve_kv_groups(ngram) is not None
