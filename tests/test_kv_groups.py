"""Hybrid KV cache (sim.core.kv_groups): content invariance and KV conservation under preemption and
prefix caching, for sliding-window, chunked, MLA-free hybrids and linear-attention state groups."""
from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, strategies as st

from kernels_cost_model.kv_layout import KVCacheGroupSpec
from kernels_cost_model.model_shapes import CHUNKED, FULL, LINEAR, SLIDING
from sim.core.cost import LinearCostModel
from sim.core.kv_groups import HybridKVCacheManager
from sim.core.request import Request
from sim.engine.engine import Engine
from tests.engine_harness import assert_outputs_match_run_until_stop, drive, engine_configs, scripted_specs

LAYOUTS = {
    "gpt-oss-like": (KVCacheGroupSpec(FULL, 2), KVCacheGroupSpec(SLIDING, 2, window=8)),
    "gemma-like": (KVCacheGroupSpec(FULL, 1), KVCacheGroupSpec(SLIDING, 1, window=20),
                   KVCacheGroupSpec(SLIDING, 1, window=20)),
    "llama4-like": (KVCacheGroupSpec(FULL, 1), KVCacheGroupSpec(CHUNKED, 1, window=32)),
    "qwen3-next-like": (KVCacheGroupSpec(FULL, 1), KVCacheGroupSpec(LINEAR, 1, state_blocks=2)),
}


def hybrid_engine(config, groups) -> Engine:
    # room for one max_model_len request in every group (plus states), so a lone request always fits
    per_request = sum(g.state_blocks or -(-config.max_model_len // config.block_size) for g in groups)
    config = dataclasses.replace(config, num_gpu_blocks=max(config.num_gpu_blocks, per_request + 1))
    return Engine(config, LinearCostModel(), config.num_gpu_blocks, kv_groups=groups)


@given(scripted_specs(), engine_configs(), st.sampled_from(sorted(LAYOUTS)))
def test_hybrid_outputs_equal_run_until_stop_and_kv_is_conserved(specs, config, layout):
    engine = hybrid_engine(config, LAYOUTS[layout])
    drive(engine, specs)  # check_invariants=True: every group checked after every step
    assert_outputs_match_run_until_stop(engine, specs)
    kv = engine.state.kv
    assert not kv.req_blocks and not kv.req_tables
    assert kv.num_free_blocks == kv.num_usable_blocks
    assert all(c == 0 for c in kv.ref_cnt)


def _request(n: int, rid: str = "a") -> Request:
    from sim.core.sampling_params import SamplingParams
    return Request(rid, np.arange(n, dtype=np.int32) + 3, SamplingParams(max_tokens=4), None)


def test_sliding_window_frees_blocks_outside_the_window():
    kv = HybridKVCacheManager(100, 4, False, LAYOUTS["gpt-oss-like"])
    req = _request(40)
    assert len(kv.allocate(req, 40)) == 20        # a whole prompt: every block in both groups
    req.num_computed_tokens = 40
    kv.allocate(req, 1)                           # decode: window 8 keeps tokens 33..40, blocks 8..10
    full, sliding = kv.req_tables[req]
    assert len(full) == 11 and None not in full
    assert sliding[:8] == [None] * 8 and None not in sliding[8:]
    assert kv.num_used_blocks == 11 + 3


def test_chunked_attention_keeps_only_the_current_chunk():
    kv = HybridKVCacheManager(100, 4, False, LAYOUTS["llama4-like"])
    req = _request(70)
    kv.allocate(req, 70)
    req.num_computed_tokens = 70
    kv.allocate(req, 1)                           # chunk 32: tokens 64.. live, blocks 16..17
    assert kv.req_tables[req][1][:16] == [None] * 16
    assert kv.num_used_blocks == 18 + 2


def test_linear_state_is_per_request_whatever_the_length():
    kv = HybridKVCacheManager(100, 4, True, LAYOUTS["qwen3-next-like"])
    short, long = _request(4, "s"), _request(60, "l")
    kv.allocate(short, 4)
    kv.allocate(long, 60)
    assert [len(t) for t in kv.req_tables[short]] == [1, 2]
    assert [len(t) for t in kv.req_tables[long]] == [15, 2]
    assert kv.lookup_prefix(_request(60, "again")) == ([], 0)   # state groups: no prefix hits


def test_prefix_hit_needs_only_the_window_in_a_sliding_group():
    kv = HybridKVCacheManager(100, 4, True, LAYOUTS["gpt-oss-like"])
    first = _request(41, "first")
    kv.allocate(first, 41)
    first.num_computed_tokens = 41
    kv.cache_full_blocks(first)
    kv.free(first)
    tables, hit = kv.lookup_prefix(_request(41, "second"))
    assert hit == 40                              # 10 full blocks of 4; the last token is recomputed
    assert len(tables[0]) == 10 and None not in tables[0]
    assert tables[1][:8] == [None] * 8 and None not in tables[1][8:]


def test_a_pinned_cache_too_small_for_one_request_per_layer_group_is_named():
    """gemma-3-27b's full-attention group holds 448 tokens in 200 pinned blocks (its sliding-window
    group takes the rest): below one 1,024-token request. Checked once the cache was sized only; pinned,
    the run ended with requests that never finished, or (without scheduler_reserve_full_isl) never ended."""
    import pytest
    from kernels_cost_model.errors import ConfigError
    from sim import SimulationConfig, simulate
    for engine in ({"max_model_len": 1024, "num_gpu_blocks": 200},
                   {"block_size": 128, "num_gpu_blocks": 65, "max_num_batched_tokens": 512,
                    "scheduler_reserve_full_isl": False}):
        config = SimulationConfig(engine=engine, deployment={"model": "gemma-3-27b", "cost_model": "linear"},
                                  workload={"num_requests": 2, "rate": 1.0, "max_tokens": 100})
        with pytest.raises(ConfigError, match=f"engine.num_gpu_blocks={engine['num_gpu_blocks']}: .* less than one request"):
            simulate(config)
