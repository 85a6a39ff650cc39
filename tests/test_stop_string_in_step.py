"""A stop string completed inside a step of several tokens (speculative decoding).

vLLM 0.19.1's front end keeps the step's later tokens (its detokenizer cuts only the text) and searches the
step's text once, so list order picks among stop strings found anywhere in it; 0.33.0 drops them. The
expected values are what vLLM's own detokenizers reported (tests/data/vllm_conformance/*-spec-stop.jsonl.gz
and `benchmarks/vllm_conformance.py`).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.errors import ConfigError
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.replay import run_until_stop
from sim.core.sampling_params import SamplingParams
from sim.core.speculative import SpeculativeConfig
from sim.core.stop_rules import PROFILES, get_profile
from sim.core.text import BYTE_EOS_TOKEN_ID
from sim.engine.engine import Engine
from sim.engine.spec_decode import SpecDecoder
from tests.engine_harness import EOS, drive
from workloads.acceptance import ScriptedAcceptance
from workloads.spec import RequestSpec
from workloads.strategies import sampling_params, text_token_ids

TEXT = {EOS: "", 3: "a", 4: "b", 5: "c", 6: "d", 8: "f", 9: "g", 10: "h"}
ABCDF = [3, 4, 5, 6, 8, 9, 10, 3, 4]  # a b c d f g h a b


def replay(stream, profile, sizes, **params):
    return run_until_stop(stream, EOS, SamplingParams(**dict(dict(max_tokens=20), **params)), token_text=TEXT,
                          profile=profile, tokens_per_step=sizes)


# ----- run_until_stop ---------------------------------------------------------------------------
def test_the_profile_field_is_vllm_0_19s_alone():
    assert get_profile("vllm-0.19").keeps_tokens_after_stop_string
    assert not any(p.keeps_tokens_after_stop_string for name, p in PROFILES.items() if name != "vllm-0.19")


@pytest.mark.parametrize("profile, kept", [("vllm-0.19", 5), ("vllm", 4)])
def test_tokens_after_the_stop_string_in_its_step(profile, kept):
    """'a', then a step of b c d f: 'cd' completes on d; 0.19.1 keeps f, 0.33 drops it."""
    got = replay(ABCDF, profile, [1, 4], stop=("cd",))
    assert got.output_token_ids == ABCDF[:kept]
    assert (got.finish_reason, got.stop_reason, got.text) == ("stop", "cd", "ab")


def test_one_token_per_step_is_the_default():
    assert replay(ABCDF, "vllm-0.19", None, stop=("cd",)).output_token_ids == ABCDF[:4]
    assert replay(ABCDF, "vllm-0.19", [1, 1, 1, 4], stop=("cd",)).output_token_ids == ABCDF[:7]


@pytest.mark.parametrize("profile, reason, text, kept", [("vllm-0.19", "f", "gab", 5), ("vllm", "ab", "g", 3)])
def test_stop_strings_of_one_step_in_list_order_under_0_19(profile, reason, text, kept):
    """'g', then a b f h: 'ab' completes first, but 0.19.1 searches the step once and 'f' comes first
    in the list."""
    stream = [9, 3, 4, 8, 10, 5]
    got = replay(stream, profile, [1, 4], stop=("f", "ab"))
    assert (got.stop_reason, got.text, got.output_token_ids) == (reason, text, stream[:kept])


@pytest.mark.parametrize("include, text", [(False, "ab"), (True, "abcd")])
def test_the_engine_cores_own_stop_ends_the_kept_tokens(include, text):
    """b c d EOS h: the engine core stops on EOS in the same step; the client gets EOS too, reason 'cd'."""
    got = replay([3, 4, 5, 6, EOS, 10], "vllm-0.19", [1, 5], stop=("cd",), include_stop_str_in_output=include)
    assert got.output_token_ids == [3, 4, 5, 6, EOS]
    assert (got.finish_reason, got.stop_reason, got.text) == ("stop", "cd", text)
    capped = replay(ABCDF, "vllm-0.19", [1, 6], stop=("cd",), max_tokens=6)
    assert (capped.output_token_ids, capped.finish_reason, capped.stop_reason) == (ABCDF[:6], "stop", "cd")


def test_min_tokens_floor_inside_the_step():
    """'g', then b c d f with min_tokens=3: 'b' (output 2) is below the floor, 'cd' (ends on output 4) is
    past it; the search starts after output 3, as 0.19.1's stop_check_offset does."""
    got = replay([9, 4, 5, 6, 8, 10], "vllm-0.19", [1, 4], stop=("b", "cd"), min_tokens=3)
    assert (got.output_token_ids, got.stop_reason, got.text) == ([9, 4, 5, 6, 8], "cd", "gb")


def test_step_sizes_must_be_positive():
    with pytest.raises(ConfigError, match="tokens_per_step"):
        replay(ABCDF, "vllm-0.19", [1, 0], stop=("cd",))


steps = st.lists(st.integers(1, 5), max_size=12)


@given(text_token_ids(max_size=30), sampling_params(max_max_tokens=20), steps,
       st.sampled_from(["vllm", "vllm-v1-2025", "vllm-v0"]))
def test_steps_change_nothing_where_the_profile_drops_the_rest(stream, params, sizes, profile):
    plain = run_until_stop(stream, BYTE_EOS_TOKEN_ID, params, profile=profile)
    assert run_until_stop(stream, BYTE_EOS_TOKEN_ID, params, profile=profile, tokens_per_step=sizes) == plain


@given(text_token_ids(max_size=30), sampling_params(max_max_tokens=20), steps)
def test_under_0_19_a_stop_string_keeps_the_rest_of_its_step(stream, params, sizes):
    """The result one token at a time is a prefix of the stepped one, which goes on to the end of the
    step the stop string completed in, unless a token rule or the stream ends it sooner."""
    plain = run_until_stop(stream, BYTE_EOS_TOKEN_ID, params, profile="vllm-0.19")
    got = run_until_stop(stream, BYTE_EOS_TOKEN_ID, params, profile="vllm-0.19", tokens_per_step=sizes)
    if not isinstance(plain.stop_reason, str):
        assert got == plain
        return
    stop_at, n = len(plain.output_token_ids), len(got.output_token_ids)
    assert got.output_token_ids[:stop_at] == plain.output_token_ids and got.finish_reason == "stop"
    step_end = next((end for end in np.cumsum(sizes).tolist() if end >= stop_at), stop_at)
    assert stop_at <= n <= step_end
    token_stops = set(params.stop_token_ids) | (set() if params.ignore_eos else {BYTE_EOS_TOKEN_ID})
    assert n == step_end or n == len(stream) or n == params.max_tokens or got.output_token_ids[-1] in token_stops


# ----- the engine -------------------------------------------------------------------------------
def one_request(profile, detection, async_, stream=ABCDF, stop=("cd",), k=3):
    """One request through an engine with k drafts, every draft accepted; (engine, request index 0)."""
    config = EngineConfig(block_size=4, num_gpu_blocks=64, max_model_len=64, eos_token_id=EOS,
                          stop_profile=profile, scheduler_profile="vllm-0.19" if profile == "vllm-0.19" else "vllm",
                          check_invariants=True, async_scheduling=async_, stop_string_detection=detection)
    hook = SpecDecoder(SpeculativeConfig("eagle3", num_speculative_tokens=k),
                       ScriptedAcceptance({}, default=lambda i, p, d: d))
    engine = Engine(config, LinearCostModel(fixed_s=1.0, per_new_token_s=0.0, per_context_token_s=0.0,
                                            per_sampled_s=0.0), 64, token_text=TEXT, hooks=[hook])
    spec = RequestSpec(0.0, np.arange(8, dtype=np.int32) + 100, output_token_ids=tuple(stream),
                       sampling_params=SamplingParams(max_tokens=20, stop=stop), request_id="r")
    drive(engine, [spec])
    return engine.requests


@pytest.mark.parametrize("detection", ["engine", "frontend"])
@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("profile, kept", [("vllm-0.19", 5), ("vllm", 4)])
def test_the_client_counts_and_times_the_kept_tokens(profile, kept, detection, async_):
    """'a' after the prefill, then b c d f in one step: under 0.19.1 f is the client's 5th token, timed
    with the step (so TPOT and ITL count it); under 0.33 the client has 4."""
    rec = one_request(profile, detection, async_)
    assert (rec.finish_reason[0], rec.stop_reason[0], int(rec.num_output_tokens[0])) == ("stop", "cd", kept)
    times = rec.token_times[0]
    assert len(times) == kept and list(times[1:]) == [times[1]] * (kept - 1)  # one step's tokens, one time
    assert rec.finish_time[0] == times[-1]


@pytest.mark.parametrize("detection", ["engine", "frontend"])
def test_a_step_with_no_stop_string_inside_is_unchanged(detection):
    """The stop string completed by a step's last token: both releases agree."""
    for profile in ("vllm-0.19", "vllm"):
        rec = one_request(profile, detection, False, stream=[3, 4, 5, 8, 6, 8, 9], stop=("fd",))
        assert (int(rec.num_output_tokens[0]), rec.stop_reason[0]) == (5, "fd")
