"""Speculative decoding under async scheduling (vLLM V1's AsyncScheduler, issue 16).

Step N+1 is planned before step N's tokens are known: a sampling row leaves 1 + drafts
placeholders and gets placeholder drafts for its next step. Content never changes: outputs, finish
and stop reasons equal run_until_stop, whatever is accepted, under chunking, preemption and KV
pressure; the invariants (computed <= tokens + placeholders, KV conserved) hold every step.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.errors import ConfigError
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.hooks import EngineHook
from sim.core.replay import run_until_stop
from sim.core.sampling_params import SamplingParams
from sim.core.speculative import SpeculativeConfig
from sim.engine.engine import Engine
from sim.engine.spec_decode import SpecDecoder
from tests.engine_harness import EOS, engine_configs, padded_budget
from tests.test_spec_decode_properties import (PROFILES, TOKEN_TEXT, StepSizes, acceptance_scripts,
                                              assert_outputs_equal_run_until_stop, spec_requests)
from workloads.acceptance import ScriptedAcceptance
from workloads.spec import RequestSpec
from workloads.token_streams import stream_for


def drive_async(engine: Engine, specs, max_steps: int = 100_000) -> int:
    """The simulation loop's order without SimPy: the next step is planned when one starts."""
    now, pending, step, steps = 0.0, sorted(specs, key=lambda s: s.arrival_time_s), None, 0
    while pending or engine.has_work or step is not None:
        while pending and pending[0].arrival_time_s <= now:
            engine.add_request(pending.pop(0), now)
        if step is None:
            step = engine.plan_step(now) if engine.has_work else None
            if step is None:
                assert pending, "engine has work it cannot schedule"
                now = pending[0].arrival_time_s
                continue
        following = engine.plan_step(now) if engine.has_work else None
        now += step.duration
        engine.finish_step(step, now)
        step, steps = following, steps + 1
        assert steps < max_steps, "runaway simulation"
    return steps


class AsyncChecks(EngineHook):
    """Every planned row stays below max_model_len; after every step placeholders are never
    negative and a running request holds no more blocks than its tokens, its placeholders, the
    next step's 1 + k, the lookahead and k more need: rejected slots are reused, not piled up. (The
    k more: a plan made while a step was in flight allocated for that step's drafts as if accepted,
    as vLLM's `num_tokens_with_spec + num_output_placeholders` does; once they are rejected the blocks
    stay, and with one-token blocks the thorough hypothesis profile finds them one block above.)"""

    def __init__(self, k: int, lookahead: int):
        self.k, self.lookahead = k, lookahead
        self.rows: list[tuple[int, int]] = []  # (scheduled tokens, drafts) of every row

    def on_plan(self, engine, step) -> None:
        for req, n in step.plan.scheduled:
            assert req.num_computed_tokens + n <= engine.config.max_model_len - 1

    def on_step_end(self, engine, now: float) -> None:
        kv = engine.state.kv
        for req in engine.state.running:
            assert req.num_output_placeholders >= 0
            need = req.num_tokens + req.num_output_placeholders + 1 + 2 * self.k + self.lookahead
            assert len(kv.blocks_of(req)) <= -(-need // kv.block_size), req


def run(specs, config, acceptance, k, method="eagle3"):
    config = padded_budget(config, k)
    spec_config = SpeculativeConfig(method, num_speculative_tokens=k)
    decoder = SpecDecoder(spec_config, StepSizes(acceptance))
    hooks = [decoder, AsyncChecks(k, spec_config.num_lookahead_tokens)]
    engine = Engine(config, LinearCostModel(), config.num_gpu_blocks, token_text=TOKEN_TEXT, hooks=hooks)
    done = {}
    engine.on_finish = lambda req: done.__setitem__(req.request_id, req)
    drive_async(engine, specs)
    return engine, done


configs = st.sampled_from([56, 64, 96]).flatmap(lambda m: engine_configs(max_model_len=m))


@given(spec_requests(), configs, acceptance_scripts(), st.integers(1, 5), st.sampled_from(PROFILES),
       st.sampled_from(["eagle3", "mtp"]))
def test_async_outputs_equal_run_until_stop_whatever_the_acceptances(specs, config, acceptance, k,
                                                                     profile, method):
    config = dataclasses.replace(config, stop_profile=profile, async_scheduling=True)
    engine, done = run(specs, config, acceptance, k, method)
    assert_outputs_equal_run_until_stop(engine, done, specs, config, profile)
    assert engine.state.kv.num_used_blocks == 0  # everything freed at the end


def one_async(stream, params, acceptance, *, k=3, prompt_len=8, max_model_len=64):
    config = EngineConfig(block_size=4, num_gpu_blocks=64, max_model_len=max_model_len, eos_token_id=EOS,
                          check_invariants=True, async_scheduling=True, record_token_times=True)
    engine = Engine(config, LinearCostModel(), 64, token_text=TOKEN_TEXT,
                    hooks=[SpecDecoder(SpeculativeConfig("eagle3", num_speculative_tokens=k), acceptance)])
    done = []
    engine.on_finish = done.append
    spec = RequestSpec(0.0, np.arange(prompt_len, dtype=np.int32) + 100, output_token_ids=tuple(stream),
                       sampling_params=params, request_id="r")
    steps = drive_async(engine, [spec])
    return done[0], engine, steps


def test_every_step_verifies_k_drafts_before_the_last_ones_are_known():
    accept_one = ScriptedAcceptance({}, default=lambda i, p, d: min(d, 1))
    req, engine, _ = one_async([5] * 40, SamplingParams(max_tokens=30, ignore_eos=True), accept_one)
    assert len(req.output_token_ids) == 30 and req.finish_reason == "length"
    drafts = engine.steps.extra["num_draft_tokens"]
    # after the prefill, every step verifies 3 drafts though the step before it had rejected two;
    # only the last steps are capped by what max_tokens leaves (placeholders counted as emitted)
    assert drafts[1:6] == [3] * 5
    accepted = engine.steps.extra["num_accepted_tokens"]
    assert sum(accepted) + sum(1 for d in drafts if d) + 1 >= 30 - 1


def test_stop_inside_an_accepted_run_wastes_the_step_in_flight():
    accept_all = ScriptedAcceptance({}, default=lambda i, p, d: d)
    req, engine, _ = one_async([5, 5, EOS, 5, 5, 5, 5, 5], SamplingParams(max_tokens=20), accept_all)
    assert req.output_token_ids == [5, 5, EOS] and req.finish_reason == "stop"
    assert engine.state.kv.num_used_blocks == 0


def test_async_ngram_is_a_named_error():
    config = EngineConfig(block_size=4, num_gpu_blocks=64, max_model_len=64, eos_token_id=EOS,
                          async_scheduling=True)
    with pytest.raises(ConfigError, match="async_scheduling.*n-gram"):
        Engine(config, LinearCostModel(), 64,
               hooks=[SpecDecoder(SpeculativeConfig("ngram"), ScriptedAcceptance({}))])
    from sim.api.simulator import SimulationConfig, simulate
    base = SimulationConfig().replace(workload={"num_requests": 4, "rate": 1.0, "max_tokens": 8})
    with pytest.raises(ConfigError, match="async_scheduling"):
        simulate(base.replace(engine={"async_scheduling": True}, speculative_config={"method": "ngram"}))
    unset = simulate(base.replace(speculative_config={"method": "ngram"}))  # unset: turns off
    assert unset.summary["spec_decode_num_drafts"] > 0


def test_async_spec_keeps_content_and_acceptance():
    from sim.api.simulator import SimulationConfig, simulate
    base = SimulationConfig().replace(workload={"num_requests": 30, "rate": 2.0, "max_tokens": 48},
                                      speculative_config={"method": "eagle3", "num_speculative_tokens": 3})
    sync = simulate(base.replace(engine={"async_scheduling": False}))
    async_ = simulate(base.replace(engine={"async_scheduling": True}))
    assert (sync.requests["num_output_tokens"].tolist() == async_.requests["num_output_tokens"].tolist())
    assert async_.summary["spec_decode_num_drafts"] > 0
    assert async_.summary["spec_decode_acceptance_length"] == pytest.approx(
        sync.summary["spec_decode_acceptance_length"], rel=0.1)


@pytest.mark.parametrize("accept", [0, 1, 3])
def test_preemption_with_drafts_in_flight_keeps_content(accept):
    """KV for two requests' prompts but not their outputs: one is preempted while a step of its
    drafts is in flight; its tokens still arrive, and it recomputes and finishes exactly."""
    config = EngineConfig(block_size=4, num_gpu_blocks=14, max_model_len=48, eos_token_id=EOS,
                          check_invariants=True, async_scheduling=True, record_token_times=True)
    acceptance = ScriptedAcceptance({}, default=lambda i, p, d: min(d, accept))
    engine = Engine(config, LinearCostModel(), 14, token_text=TOKEN_TEXT,
                    hooks=[SpecDecoder(SpeculativeConfig("eagle3", num_speculative_tokens=3), acceptance)])
    done = {}
    engine.on_finish = lambda req: done.__setitem__(req.request_id, req)
    params = SamplingParams(max_tokens=30, ignore_eos=True, stop_token_ids=[7])
    specs = [RequestSpec(0.0, np.arange(12, dtype=np.int32) + 100 * i, sampling_params=params,
                         output_token_ids=tuple([5, 6] * 12 + [7, 5]), request_id=f"r{i}")
             for i in range(2)]
    drive_async(engine, specs)
    assert sum(engine.steps.num_preempted) > 0
    for i, spec in enumerate(specs):
        stream = [stream_for(spec, i, EOS)(p) for p in range(64)]
        want = run_until_stop(stream, EOS, params, prompt_len=12, max_model_len=48, token_text=TOKEN_TEXT)
        assert done[spec.request_id].output_token_ids == want.output_token_ids
        assert done[spec.request_id].stop_reason == 7
    assert engine.state.kv.num_used_blocks == 0
