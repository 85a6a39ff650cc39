"""vLLM 0.33's Mamba "align" mode, rule by rule: the chunk clipping (policies.mamba_align), the state
blocks (sim.core.kv_mamba_align) and the concurrency line (KVCacheLayout.admission_blocks)."""
from __future__ import annotations

import numpy as np
import pytest

from kernels_cost_model.errors import ConfigError
from kernels_cost_model.kv_layout import KVCacheGroupSpec, KVCacheLayout
from kernels_cost_model.model_shapes import FULL, LINEAR, SLIDING
from policies.mamba_align import aligned_chunk
from sim.core.config import EngineConfig
from sim.core.kv_managers import kv_manager_for
from sim.core.kv_mamba_align import MambaAlignKVCacheManager
from sim.core.request import Request
from sim.core.sampling_params import SamplingParams

GROUPS = (KVCacheGroupSpec(FULL, 1), KVCacheGroupSpec(LINEAR, 1, state_blocks=1))


def _request(prompt_len: int, rid: str = "r", prefix=()) -> Request:
    prompt = list(prefix) + [100 + i + 1000 * len(rid) for i in range(prompt_len - len(prefix))]
    return Request(rid, np.array(prompt, dtype=np.int32), SamplingParams(max_tokens=4), eos_token_id=2)


def _config(**engine) -> EngineConfig:
    values = dict(block_size=4, num_gpu_blocks=40, max_model_len=128, max_num_batched_tokens=64,
                  enable_prefix_caching=True, scheduler_profile="vllm-0.33")
    return EngineConfig(**{**values, **engine}).resolved()


def test_chunks_end_on_block_boundaries_and_before_the_last_token():
    kv = MambaAlignKVCacheManager(40, 4, True, GROUPS)
    config = _config()
    req = _request(41)
    assert aligned_chunk(kv, config, req, 41) == 40   # the last state that can be cached: 40
    assert aligned_chunk(kv, config, req, 30) == 28   # cut back to a block boundary
    req.num_computed_tokens = 40
    assert aligned_chunk(kv, config, req, 1) == 1     # the prompt's last token
    req.num_computed_tokens = 6
    assert aligned_chunk(kv, config, req, 20) == 2    # a chunk starting mid-block ends at the next boundary


def test_a_block_wider_than_any_chunk_advances_within_it():
    kv = MambaAlignKVCacheManager(40, 16, True, GROUPS)
    req = _request(60)
    assert aligned_chunk(kv, _config(block_size=16, long_prefill_token_threshold=8), req, 8) == 8
    assert aligned_chunk(kv, _config(block_size=16), req, 8) == 0  # nothing: not scheduled this step


def test_states_are_positional_and_freed_behind_the_processed_tokens():
    kv = MambaAlignKVCacheManager(40, 4, True, GROUPS)
    req = _request(41)
    kv.allocate(req, 40)
    full, state = kv.req_tables[req]
    assert len(full) == 10 and state[:9] == [None] * 9 and state[9] is not None
    req.num_computed_tokens = 40
    kv.allocate(req, 1)
    full, state = kv.req_tables[req]
    assert state[9] is not None and state[10] is not None  # the running state and the one it is copied from
    req.num_computed_tokens = 41
    req.output_token_ids.extend(range(4))
    kv.allocate(req, 4)
    assert kv.req_tables[req][1][9] is None


def test_a_hit_is_the_last_cached_state_within_the_full_attention_hit():
    kv = MambaAlignKVCacheManager(60, 4, True, GROUPS)
    first = _request(41, "a")
    kv.allocate(first, 40)
    kv.new_step_starts()
    second = _request(50, "b", prefix=first.prompt_token_ids[:41])
    tables, hit = kv.lookup_prefix(second)
    assert hit == 40 and tables[1] == [None] * 9 + [kv.req_tables[first][1][9]]
    assert kv.shared_prefix_boundary(second) == 0
    shorter = _request(50, "c", prefix=first.prompt_token_ids[:30])  # (blocks 0..6 hit in full attention)
    assert kv.lookup_prefix(shorter)[1] == 0  # no state cached at 4..28: no hit,
    assert kv.shared_prefix_boundary(shorter) == 28  # and the next chunk stops where the full hit ends


def test_the_concurrency_line_counts_two_states_per_request():
    layout = KVCacheLayout(GROUPS, 100, 1, 16)
    assert layout.admission_blocks(1024, 512) == 64 + 1
    assert layout.with_mamba_align().admission_blocks(1024, 512) == 64 + 2


def test_which_runs_take_align_mode():
    assert isinstance(kv_manager_for(_config(), 40, GROUPS), MambaAlignKVCacheManager)
    for engine in ({"scheduler_profile": "vllm-0.19"}, {"enable_prefix_caching": False}):
        assert not isinstance(kv_manager_for(_config(**engine), 40, GROUPS), MambaAlignKVCacheManager)
    with_window = GROUPS + (KVCacheGroupSpec(SLIDING, 1, window=8),)
    assert not isinstance(kv_manager_for(_config(), 40, with_window), MambaAlignKVCacheManager)
    with pytest.raises(ConfigError, match="enable_chunked_prefill"):
        kv_manager_for(_config(enable_chunked_prefill=False, max_num_batched_tokens=128), 40, GROUPS)
