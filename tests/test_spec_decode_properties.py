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

PROFILES = ("vllm", "vllm-v1-2025", "vllm-v0", "vllm-0.19")
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


class StepSizes:
    """An acceptance model that remembers what it accepted at each (request index, output position), so a
    test knows the steps each request's tokens came in (`tokens_per_step` of run_until_stop: under vLLM
    0.19.1's stop profile a stop string completed inside a step keeps the step's later tokens)."""

    def __init__(self, inner):
        self.inner, self.accepted = inner, {}

    def num_accepted(self, index: int, position: int, drafts: int) -> int:
        n = self.accepted[index, position] = self.inner.num_accepted(index, position, drafts)
        return n

    def __getattr__(self, name: str):
        if name != "accepted_on_tree":
            raise AttributeError(name)
        inner = getattr(self.inner, name)  # (AttributeError where the model has no tree rule)

        def accepted_on_tree(index: int, position: int, *args):
            n = self.accepted[index, position] = inner(index, position, *args)
            return n
        return accepted_on_tree

    def sizes(self, index: int, most: int = 200) -> list[int]:
        """The tokens of each of request `index`'s steps: 1 + what the step starting at each position accepted."""
        sizes, position = [], 0
        while position < most:
            sizes.append(1 + self.accepted.get((index, position), 0))
            position += sizes[-1]
        return sizes


def step_sizes(engine, index: int) -> list[int] | None:
    """The step sizes of request `index` where the engine's spec decoder accepts through `StepSizes`."""
    for hook in engine.hooks:
        if isinstance(getattr(hook, "acceptance", None), StepSizes):
            return hook.acceptance.sizes(index)
    return None


def run(specs, config, acceptance, k, method="eagle3"):
    config = padded_budget(config, k)
    spec_config = SpeculativeConfig(method, num_speculative_tokens=k)
    hooks = [SpecDecoder(spec_config, StepSizes(acceptance)), StepChecks(k, spec_config.num_lookahead_tokens)]
    engine = Engine(config, LinearCostModel(), config.num_gpu_blocks, token_text=TOKEN_TEXT, hooks=hooks)
    done = {}
    engine.on_finish = lambda req: done.__setitem__(req.request_id, req)
    return engine, drive(engine, specs), done


configs = st.sampled_from([56, 64, 96]).flatmap(lambda m: engine_configs(max_model_len=m))


def assert_outputs_equal_run_until_stop(engine, done, specs, config, profile) -> None:
    """Every request's tokens, finish and stop reason equal `run_until_stop` on its stream (in the steps
    the engine gave them, where its spec decoder accepts through `StepSizes`), and no position is
    emitted twice. (With stop strings found in the front end the engine may append tokens after the
    client's finish: the client's are the first `num_output_tokens`.)"""
    rec = engine.requests
    for i, spec in enumerate(specs):
        stream = [stream_for(spec, i, EOS)(p) for p in range(120)]
        want = run_until_stop(stream, EOS, spec.sampling_params, prompt_len=spec.num_prompt_tokens,
                              max_model_len=config.max_model_len, token_text=TOKEN_TEXT, profile=profile,
                              tokens_per_step=step_sizes(engine, i))
        got, count = done[spec.request_id], int(rec.num_output_tokens[i])
        assert (count, got.output_token_ids[:count]) == (len(want.output_token_ids), want.output_token_ids)
        assert (rec.finish_reason[i], rec.stop_reason[i]) == (want.finish_reason, want.stop_reason)
        assert len(rec.token_times[i]) == count


@given(spec_requests(), configs, acceptance_scripts(), st.integers(1, 5), st.sampled_from(PROFILES),
       st.sampled_from(["eagle3", "ngram"]), st.sampled_from([None, "frontend"]))
def test_outputs_equal_run_until_stop_whatever_the_acceptances(specs, config, acceptance, k, profile,
                                                               method, detection):
    config = dataclasses.replace(config, stop_profile=profile, async_scheduling=False,
                                 stop_string_detection=detection)
    engine, logs, done = run(specs, config, acceptance, k, method)
    assert_outputs_equal_run_until_stop(engine, done, specs, config, profile)
    # a request the front end stopped may run on until its abort lands, which wastes that step's tokens
    stopped_in_front_end = {rid for rid, req in done.items() if req.client_finished}
    for log in logs:
        for rid, computed, n, num_tokens, emitted in log.rows:
            drafts = max(0, computed + n - num_tokens)
            assert emitted <= 1 + drafts
            caught_up = computed + n >= num_tokens  # the catch-up rule decides
            assert emitted == 0 if not caught_up else (emitted > 0 or rid in stopped_in_front_end)
            if drafts:
                assert computed + n <= config.max_model_len - 1

