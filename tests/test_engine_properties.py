"""Scheduling changes timing, never content: engine properties over random runs (issue 3)."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.engine_harness import (EOS, assert_outputs_match_run_until_stop, drive, engine_configs,
                                  make_engine, scripted_specs)



@given(scripted_specs(), engine_configs())
def test_outputs_equal_run_until_stop_whatever_the_schedule(specs, config):
    engine = make_engine(config)
    drive(engine, specs)
    assert_outputs_match_run_until_stop(engine, specs)


@given(scripted_specs(), engine_configs())
def test_catch_up_rule_every_step(specs, config):
    """A request samples in a step iff computed + new == num_tokens; one token at most."""
    engine = make_engine(config)
    for log in drive(engine, specs):
        for _rid, computed, n, num_tokens, emitted in log.rows:
            assert computed + n <= num_tokens
            assert emitted == (1 if computed + n == num_tokens else 0)


@given(scripted_specs(), engine_configs())
def test_each_position_emitted_once_and_first_token_at_catch_up(specs, config):
    engine = make_engine(config)
    logs = drive(engine, specs)
    rec = engine.requests
    emitted: dict[str, list[float]] = {}
    first_catch_up: dict[str, float] = {}
    for log in logs:
        for rid, _computed, _n, _num_tokens, count in log.rows:
            if count:
                emitted.setdefault(rid, []).append(log.end)
                first_catch_up.setdefault(rid, log.end)
    for i, rid in enumerate(rec.request_id):
        times = emitted.get(rid, [])
        assert len(times) == rec.num_output_tokens[i]
        assert list(rec.token_times[i]) == times
        if times:
            assert rec.first_token_time[i] == first_catch_up[rid]


@given(scripted_specs(), engine_configs())
def test_everything_finishes_and_kv_is_released(specs, config):
    engine = make_engine(config)
    drive(engine, specs)
    kv = engine.state.kv
    assert all(reason is not None for reason in engine.requests.finish_reason)
    assert kv.num_free_blocks == kv.num_usable_blocks
    assert not kv.req_blocks and not engine.state.running and not engine.state.waiting


@given(scripted_specs(max_requests=6))
def test_infinite_kv_never_preempts(specs):
    from sim.core.config import EngineConfig
    config = EngineConfig(num_gpu_blocks=4096, max_model_len=256, eos_token_id=EOS,
                          max_num_batched_tokens=64, check_invariants=True)
    engine = make_engine(config)
    drive(engine, specs)
    assert sum(engine.requests.num_preemptions) == 0


@given(st.integers(1, 250), st.integers(1, 100), st.integers(0, 40))
def test_single_request_ttft_is_sum_of_prefill_steps(prompt_len, budget, threshold):
    from sim.core.config import EngineConfig
    from workloads.spec import RequestSpec
    config = EngineConfig(num_gpu_blocks=64, max_model_len=256, eos_token_id=EOS,
                          max_num_batched_tokens=budget, long_prefill_token_threshold=threshold,
                          check_invariants=True)
    engine = make_engine(config)
    spec = RequestSpec(0.0, np.arange(prompt_len, dtype=np.int32) + 10, output_len=3)
    durations = []
    logs = drive(engine, [spec])
    prev = 0.0
    for log in logs:
        durations.append(log.end - prev)
        prev = log.end
        if log.rows[0][4]:
            break
    chunk = min(budget, threshold) if threshold else budget
    assert len(durations) == -(-prompt_len // chunk)
    assert engine.requests.first_token_time[0] == sum(durations)
