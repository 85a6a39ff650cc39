"""Stop rules checked on the output alone, over scripted token streams.

Each property states a rule of the issue (caps, min_tokens floor, ignore_eos, EOS in usage, purity)
without re-deriving the whole outcome; tests/test_stop_oracle.py holds the full-outcome oracle.
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from sim import SamplingParams, run_until_stop
from sim.core.text import BYTE_EOS_TOKEN_ID
from workloads.strategies import (StopScenario, sampling_params, stop_scenarios, text_token_ids,
                                  word_streams)

PROFILES = ("vllm", "vllm-v1-2025", "vllm-v0")
FILLER = ord("a")
STOP_ID = ord("x")


def byte_text(token_id: int) -> str:
    """Byte tokenizer text: ids 0-255 are characters, EOS has no text."""
    return "" if token_id == BYTE_EOS_TOKEN_ID else chr(token_id)


def replay(scenario: StopScenario, profile: str, token_stream=None, **kwargs):
    """run_until_stop on a scenario."""
    stream = scenario.token_ids if token_stream is None else token_stream
    return run_until_stop(stream, scenario.eos_token_id, scenario.params,
                          prompt_len=scenario.prompt_len, max_model_len=scenario.max_model_len,
                          profile=profile, **kwargs)


def cap_of(scenario: StopScenario) -> int:
    """The number of outputs at which a length rule fires."""
    if scenario.max_model_len is None:
        return scenario.params.max_tokens
    return min(scenario.params.max_tokens, scenario.max_model_len - scenario.prompt_len)


class CountingStream:
    """An iterator over tokens that records how many were read."""

    def __init__(self, tokens):
        self.tokens, self.num_read = list(tokens), 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.num_read == len(self.tokens):
            raise StopIteration
        self.num_read += 1
        return self.tokens[self.num_read - 1]


profiles = st.sampled_from(PROFILES)

# --- rules checked on the output alone -------------------------------------------------------


@given(stop_scenarios(), profiles)
def test_tokens_after_a_stop_are_never_read(scenario, profile):
    """The output is a prefix of the stream and the replay reads nothing past the stop."""
    stream = CountingStream(scenario.token_ids)
    result = replay(scenario, profile, token_stream=stream)
    assert stream.num_read == len(result.output_token_ids)
    assert list(scenario.token_ids[:stream.num_read]) == result.output_token_ids


@given(stop_scenarios(), profiles)
def test_cap_fires_at_exactly_the_cap(scenario, profile):
    """Never more than the cap; "length" only exactly on it; a long enough stream always ends."""
    result = replay(scenario, profile)
    num_output, cap = len(result.output_token_ids), cap_of(scenario)
    assert num_output <= cap
    if result.finish_reason == "length":
        assert num_output == cap
    if len(scenario.token_ids) >= cap:
        assert result.finish_reason is not None


@given(stop_scenarios(), profiles)
def test_no_earlier_token_could_have_stopped(scenario, profile):
    """Before the last output, no EOS or stop id sat beyond the min_tokens floor."""
    result = replay(scenario, profile)
    params = scenario.params
    for count, token in enumerate(result.output_token_ids[:-1], start=1):
        if count > params.min_tokens:
            assert token not in params.stop_token_ids
            assert params.ignore_eos or token != scenario.eos_token_id


@given(stop_scenarios(), profiles)
def test_stop_reason_names_what_stopped(scenario, profile):
    """finish "stop" is explained by the last token or by a stop string, above the floor."""
    result = replay(scenario, profile)
    if result.finish_reason != "stop":
        assert result.stop_reason is None
        return
    num_output, last = len(result.output_token_ids), result.output_token_ids[-1]
    params = scenario.params
    if result.stop_reason is None:
        assert last == scenario.eos_token_id and not params.ignore_eos
        assert num_output >= params.min_tokens
    elif isinstance(result.stop_reason, int):
        assert last == result.stop_reason and last in params.stop_token_ids
        assert num_output >= params.min_tokens
    else:
        assert result.stop_reason in params.stop
        assert num_output > params.min_tokens or profile == "vllm-v0"


@given(stop_scenarios(kinds=("stop_string",)), profiles)
def test_stop_string_truncates_the_text(scenario, profile):
    """The text stops before the stop string, or right after it with include_stop_str_in_output."""
    result = replay(scenario, profile)
    if not isinstance(result.stop_reason, str):
        return
    full_text = "".join(byte_text(token) for token in result.output_token_ids)
    if scenario.params.include_stop_str_in_output:
        assert result.text.endswith(result.stop_reason)
        assert full_text.startswith(result.text)
    else:
        assert full_text.startswith(result.text + result.stop_reason)


@given(word_streams(), sampling_params(allow_stop=False), profiles)
def test_eos_counts_toward_output_tokens_but_its_text_is_hidden(stream, params, profile):
    """An EOS stop keeps EOS as the last output token; its text shows only when included."""
    words = stream.token_text
    result = run_until_stop(stream.token_ids, stream.eos_token_id, params, token_text=words,
                            profile=profile)
    if result.finish_reason != "stop":
        return
    *before, last = result.output_token_ids
    eos_text = words[last] if params.include_stop_str_in_output else ""
    assert last == stream.eos_token_id
    assert result.text == "".join(words[token] for token in before) + eos_text


def boundary_stream(cap: int, stopper: int, at: int) -> list[int]:
    """Filler with `stopper` as output number `at`, long enough to reach past the cap."""
    tokens = [FILLER] * (max(cap, at) + 2)
    tokens[at - 1] = stopper
    return tokens


limits = st.tuples(st.integers(0, 5), st.none() | st.integers(1, 14))


@given(sampling_params(allow_stop=False), limits, st.sampled_from((BYTE_EOS_TOKEN_ID, STOP_ID)),
       profiles)
def test_stopper_exactly_on_the_cap(params, prompt_and_room, stopper, profile):
    """EOS / a stop id on the cap token: "stop" under vllm and vllm-v0, "length" under v1-2025."""
    prompt_len, room = prompt_and_room
    max_model_len = None if room is None else prompt_len + room
    params = replace(params, stop_token_ids=(STOP_ID,))
    cap = params.max_tokens if room is None else min(params.max_tokens, room)
    result = run_until_stop(boundary_stream(cap, stopper, cap), BYTE_EOS_TOKEN_ID, params,
                            prompt_len=prompt_len, max_model_len=max_model_len, profile=profile)
    stopper_active = stopper == STOP_ID or not params.ignore_eos
    content_allowed = cap > params.min_tokens
    wins = profile != "vllm-v1-2025" and stopper_active and content_allowed
    assert len(result.output_token_ids) == cap
    assert result.finish_reason == ("stop" if wins else "length")


@given(sampling_params(allow_stop=False).filter(lambda params: params.min_tokens >= 1),
       st.sampled_from((-1, 0, 1)), st.sampled_from((BYTE_EOS_TOKEN_ID, STOP_ID)), profiles)
def test_min_tokens_floor_on_its_boundary(params, offset, stopper, profile):
    """EOS and stop ids stop beyond output number min_tokens, not on it: vLLM's min-tokens logits
    processor masks them while fewer than min_tokens outputs exist (recorded: min_tokens_floor)."""
    params = replace(params, ignore_eos=False, stop_token_ids=(STOP_ID,),
                     max_tokens=params.max_tokens + 2)
    at = params.min_tokens + offset
    if at < 1:
        return
    result = run_until_stop(boundary_stream(params.max_tokens, stopper, at), BYTE_EOS_TOKEN_ID,
                            params, profile=profile)
    if at > params.min_tokens:
        assert (result.finish_reason, len(result.output_token_ids)) == ("stop", at)
    else:
        assert len(result.output_token_ids) > at


@given(st.integers(1, 10), st.sampled_from((-1, 0, 1)), st.booleans(), profiles)
def test_min_tokens_floor_for_stop_strings(min_tokens, offset, include, profile):
    """A stop string completing on output number min_tokens counts in V0 only; after it, in all."""
    params = SamplingParams(max_tokens=min_tokens + 3, min_tokens=min_tokens, stop=("x",),
                            include_stop_str_in_output=include)
    at = min_tokens + offset
    if at < 1:
        return
    result = run_until_stop(boundary_stream(params.max_tokens, STOP_ID, at), BYTE_EOS_TOKEN_ID,
                            params, profile=profile)
    floor_passed = at > min_tokens or (at == min_tokens and profile == "vllm-v0")
    assert (result.stop_reason == "x") == floor_passed
    if floor_passed:
        assert len(result.output_token_ids) == at
        assert result.text == "a" * (at - 1) + ("x" if include else "")


@given(st.integers(0, 8), st.integers(1, 12), st.integers(1, 12), profiles)
def test_max_model_len_counts_prompt_and_output(prompt_len, room, max_tokens, profile):
    """A request stops when prompt + output reaches max_model_len, or at max_tokens if sooner."""
    result = run_until_stop([FILLER] * 30, BYTE_EOS_TOKEN_ID, SamplingParams(max_tokens=max_tokens),
                            prompt_len=prompt_len, max_model_len=prompt_len + room,
                            profile=profile)
    assert result.finish_reason == "length"
    assert len(result.output_token_ids) == min(room, max_tokens)


@given(text_token_ids(min_size=30, max_size=30), sampling_params(), profiles)
def test_ignore_eos_neutralises_eos_only(tokens, params, profile):
    """With ignore_eos and no other stoppers, EOS anywhere never stops; the cap still binds."""
    params = replace(params, ignore_eos=True, stop_token_ids=(), stop=())
    result = run_until_stop(tokens, BYTE_EOS_TOKEN_ID, params, profile=profile)
    assert (result.finish_reason, len(result.output_token_ids)) == ("length", params.max_tokens)


@given(stop_scenarios(kinds=("stop_token_id",)), profiles)
def test_ignore_eos_keeps_stop_token_ids(scenario, profile):
    """ignore_eos does not disable stop_token_ids, even when EOS is listed among them."""
    params = replace(scenario.params, ignore_eos=True, stop=())
    scenario = replace(scenario, params=params)
    result = replay(scenario, profile)
    if result.finish_reason == "stop":
        assert result.stop_reason in params.stop_token_ids


@given(stop_scenarios(), profiles)
def test_result_is_a_pure_function_of_inputs(scenario, profile):
    """Equal inputs (fresh, equal SamplingParams) give equal results."""
    first = replay(scenario, profile)
    again = replay(replace(scenario, params=replace(scenario.params)), profile)
    assert first == again


@given(stop_scenarios(), st.sampled_from(("vllm-v1-2025", "vllm-v0")))
def test_profiles_differ_only_where_documented(scenario, other):
    """Without stop strings, the profiles stop on the same token; reasons differ only on the cap."""
    scenario = replace(scenario, params=replace(scenario.params, stop=()))
    today, before = replay(scenario, "vllm"), replay(scenario, other)
    assert today.output_token_ids == before.output_token_ids
    if (today.finish_reason, today.stop_reason) != (before.finish_reason, before.stop_reason):
        assert other == "vllm-v1-2025"
        assert len(today.output_token_ids) == cap_of(scenario)
        assert (today.finish_reason, before.finish_reason) == ("stop", "length")


@given(st.text("ab", max_size=3), st.booleans(), profiles)
def test_stop_token_whose_text_completes_a_stop_string(head, include, profile):
    """Shown stop-token text is searched for stop strings in V1, not in V0; hidden text never."""
    stop_str = head + "x"
    params = SamplingParams(max_tokens=8, stop_token_ids=(STOP_ID,), stop=(stop_str,),
                            include_stop_str_in_output=include)
    tokens = [ord(char) for char in head] + [STOP_ID, FILLER]
    result = run_until_stop(tokens, BYTE_EOS_TOKEN_ID, params, profile=profile)
    string_wins = include and profile != "vllm-v0"
    assert result.stop_reason == (stop_str if string_wins else STOP_ID)
    assert result.text == (stop_str if include else head)
