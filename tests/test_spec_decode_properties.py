"""Speculative decoding changes timing, never content (issue 16).

Scripted token streams and scripted acceptance patterns, under every stop profile, chunking,
preemption and KV pressure: each request's output tokens, finish reason and stop reason equal
run_until_stop on its stream; KV invariants hold every step with rejected slots reused; no output
position is emitted twice; drafts never reach past max_model_len.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim.core.cost import LinearCostModel
from sim.core.hooks import EngineHook
from sim.core.replay import run_until_stop
from sim.core.sampling_params import SamplingParams
from sim.core.speculative import SpeculativeConfig
from sim.engine.engine import Engine
from sim.engine.spec_decode import SpecDecoder
from tests.engine_harness import EOS, drive, engine_configs, padded_budget
from workloads.acceptance import ScriptedAcceptance
from workloads.spec import RequestSpec
from workloads.strategies import stop_strings
from workloads.token_streams import stream_for

PROFILES = ("vllm", "vllm-v1-2025", "vllm-v0")
LETTERS = "abcdefghij"
TOKEN_TEXT = {EOS: "", **{t: LETTERS[t - 3] for t in range(3, 13)}}  # EOS has no text


@st.composite
def stop_params(draw):
    max_tokens = draw(st.integers(1, 30))
    return SamplingParams(max_tokens=max_tokens, min_tokens=draw(st.integers(0, min(5, max_tokens))),
                          ignore_eos=draw(st.booleans()),
                          stop_token_ids=draw(st.sampled_from([(), (7,), (4, 9)])),
                          stop=draw(stop_strings("abcd", max_count=2)),
                          include_stop_str_in_output=draw(st.booleans()))


@st.composite
def spec_requests(draw, max_requests: int = 6, max_prompt: int = 50):
    specs, t = [], 0.0
    for i in range(draw(st.integers(1, max_requests))):
        t += draw(st.sampled_from([0.0, 0.001, 0.01]))
        prefix = draw(st.sampled_from([0, 0, 16]))
        body = draw(st.lists(st.integers(3, 40), min_size=1, max_size=max_prompt - prefix))
        prompt = np.asarray(list(range(500, 500 + prefix)) + body, dtype=np.int32)
        stream = tuple(draw(st.lists(st.integers(2, 12), min_size=1, max_size=40)))
        specs.append(RequestSpec(t, prompt, output_token_ids=stream, sampling_params=draw(stop_params()),
                                 request_id=f"r{i}"))
    return specs


@st.composite
def acceptance_scripts(draw, num_requests: int = 6):
    """Per request, the drafts each of its verification steps accepts; then all or none."""
    script = {i: draw(st.lists(st.integers(0, 6), max_size=12)) for i in range(num_requests)}
    accept_all = draw(st.booleans())
    return ScriptedAcceptance(script, default=lambda i, p, d: d if accept_all else 0)


class StepChecks(EngineHook):
    """After every step: a running request holds no more blocks than its tokens, k drafts and the
    lookahead need (rejected slots are reused, not piled up)."""

    def __init__(self, k: int, lookahead: int):
        self.k, self.lookahead = k, lookahead

    def on_step_end(self, engine, now: float) -> None:
        kv = engine.state.kv
        for req in engine.state.running:
            bound = -(-(req.num_tokens + self.k + self.lookahead) // kv.block_size)
            assert len(kv.blocks_of(req)) <= bound, (req, len(kv.blocks_of(req)), bound)
            assert req.num_computed_tokens <= req.num_tokens


def run(specs, config, acceptance, k, method="eagle3"):
    config = padded_budget(config, k)
    spec_config = SpeculativeConfig(method, num_speculative_tokens=k)
    hooks = [SpecDecoder(spec_config, acceptance), StepChecks(k, spec_config.num_lookahead_tokens)]
    engine = Engine(config, LinearCostModel(), config.num_gpu_blocks, token_text=TOKEN_TEXT, hooks=hooks)
    done = {}
    engine.on_finish = lambda req: done.__setitem__(req.request_id, req)
    return engine, drive(engine, specs), done


configs = st.sampled_from([56, 64, 96]).flatmap(lambda m: engine_configs(max_model_len=m))


def assert_outputs_equal_run_until_stop(engine, done, specs, config, profile) -> None:
    """Every request's tokens, finish and stop reason equal `run_until_stop` on its stream, and no
    position is emitted twice."""
    rec = engine.requests
    for i, spec in enumerate(specs):
        stream = [stream_for(spec, i, EOS)(p) for p in range(120)]
        want = run_until_stop(stream, EOS, spec.sampling_params, prompt_len=spec.num_prompt_tokens,
                              max_model_len=config.max_model_len, token_text=TOKEN_TEXT, profile=profile)
        got = done[spec.request_id]
        assert got.output_token_ids == want.output_token_ids
        assert (rec.finish_reason[i], rec.stop_reason[i]) == (want.finish_reason, want.stop_reason)
        assert len(rec.token_times[i]) == len(got.output_token_ids)


@given(spec_requests(), configs, acceptance_scripts(), st.integers(1, 5), st.sampled_from(PROFILES),
       st.sampled_from(["eagle3", "ngram"]))
def test_outputs_equal_run_until_stop_whatever_the_acceptances(specs, config, acceptance, k, profile,
                                                               method):
    config = dataclasses.replace(config, stop_profile=profile, async_scheduling=False)
    engine, logs, done = run(specs, config, acceptance, k, method)
    assert_outputs_equal_run_until_stop(engine, done, specs, config, profile)
    for log in logs:
        for _rid, computed, n, num_tokens, emitted in log.rows:
            drafts = max(0, computed + n - num_tokens)
            assert emitted <= 1 + drafts
            assert (emitted > 0) == (computed + n >= num_tokens)  # the catch-up rule decides
            if drafts:
                assert computed + n <= config.max_model_len - 1

