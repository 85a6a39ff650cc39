"""The stop rules against an oracle written independently of sim/.

The oracle walks output positions one at a time and spells each profile's rules out longhand:
`==` comparisons on the caps, a brute-force scan of every substring position for stop strings.
It shares no code with sim.core.stop_rules or sim.core.text. Sources: vllm/v1/core/sched/utils.py
(check_stop), vllm/v1/engine/detokenizer.py (update, check_stop_strings),
vllm/engine/output_processor/stop_checker.py (V0).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import assume, given
from hypothesis import strategies as st

from sim import SamplingParams, run_until_stop
from sim.core.text import BYTE_EOS_TOKEN_ID
from workloads.strategies import sampling_params, stop_scenarios, stop_strings, word_streams

PROFILES = ("vllm", "vllm-v1-2025", "vllm-v0", "vllm-0.19")
profiles = st.sampled_from(PROFILES)


def byte_text(token_id: int) -> str:
    """Oracle's own byte tokenizer: ids 0-255 are characters, EOS has no text."""
    return "" if token_id == BYTE_EOS_TOKEN_ID else chr(token_id)


@dataclass(frozen=True)
class Expected:
    """What the oracle predicts: output length, finish_reason, stop_reason, text."""

    num_output: int
    finish_reason: str | None
    stop_reason: int | str | None
    text: str


def oracle(tokens, eos, params, profile, prompt_len=0, max_model_len=None, text_of=byte_text):
    """Expected outcome of replaying `tokens` one at a time under `profile`."""
    shown = ""
    for count, token in enumerate(tokens, start=1):
        verdict = _token_verdict(profile, token, count, eos, params, prompt_len, max_model_len)
        stopped_by_token = verdict is not None and verdict[0] == "stop"
        hidden = stopped_by_token and not params.include_stop_str_in_output
        candidate = shown + ("" if hidden else text_of(token))
        if _strings_checked(profile, count, params.min_tokens, stopped_by_token):
            match = _winning_stop_string(profile, candidate, len(shown), params.stop)
            if match is not None:
                stop_str, start = match
                keep = start + len(stop_str) if params.include_stop_str_in_output else start
                return Expected(count, "stop", stop_str, candidate[:keep])
        if verdict is not None:
            return Expected(count, verdict[0], verdict[1], candidate)
        shown = candidate
    return Expected(len(tokens), None, None, shown)


def _token_verdict(profile, token, count, eos, params, prompt_len, max_model_len):
    """("stop"|"length", stop_reason) from the token rules at output number `count`, or None."""
    at_cap = count == params.max_tokens or (
        max_model_len is not None and prompt_len + count == max_model_len)
    content_allowed = count > params.min_tokens  # vLLM masks EOS and stop ids in the first min_tokens
    if profile == "vllm-0.19" and count < params.min_tokens:
        return None  # 0.19.1's check_stop returns first while num_output_tokens < min_tokens
    if profile == "vllm-v1-2025" and at_cap:
        return ("length", None)
    if content_allowed and token == eos and not params.ignore_eos:
        return ("stop", None)
    if content_allowed and token in params.stop_token_ids:
        return ("stop", token)
    if at_cap:
        return ("length", None)
    return None


def _strings_checked(profile, count, min_tokens, stopped_by_token):
    """V1 looks past the floor only, even on a token-stopped token; V0 from the floor, not then."""
    if profile == "vllm-v0":
        return count >= min_tokens and not stopped_by_token
    return count > min_tokens


def _winning_stop_string(profile, text, seen_len, stop):
    """(stop string, start) of the winning match ending after `seen_len`, by brute force."""
    matches = [
        (start + len(stop_str), order, start, stop_str)
        for order, stop_str in enumerate(stop)
        for start in range(len(text) - len(stop_str) + 1)
        if text[start:start + len(stop_str)] == stop_str and start + len(stop_str) > seen_len
    ]
    if not matches:
        return None
    if profile == "vllm":
        best = min(matches)  # earliest completion, then list order
    else:
        best = min(matches, key=lambda match: (match[1], match[0]))  # list order first
    return best[3], best[2]


# --- the oracle agrees with the engine's rules ----------------------------------------------


@given(stop_scenarios(), profiles)
def test_matches_oracle_on_byte_streams(scenario, profile):
    """Every profile agrees with the longhand oracle on planted stoppers and random filler (vLLM 0.19.1's
    only where min_tokens fits within max_model_len: beyond it the request never stops, a named error)."""
    assume(not (profile == "vllm-0.19" and scenario.max_model_len is not None
                and scenario.params.min_tokens > scenario.max_model_len - scenario.prompt_len))
    result = run_until_stop(scenario.token_ids, scenario.eos_token_id, scenario.params,
                            prompt_len=scenario.prompt_len, max_model_len=scenario.max_model_len,
                            profile=profile)
    expected = oracle(scenario.token_ids, scenario.eos_token_id, scenario.params, profile,
                      scenario.prompt_len, scenario.max_model_len)
    assert len(result.output_token_ids) == expected.num_output
    assert (result.finish_reason, result.stop_reason) == (expected.finish_reason,
                                                          expected.stop_reason)
    assert result.text == expected.text


@given(word_streams(), sampling_params(), stop_strings(alphabet="abcd.</s>", max_len=4), profiles)
def test_matches_oracle_on_multi_character_tokens(stream, params, stop, profile):
    """Several stop strings inside one token, matches ending mid-token, EOS with visible text."""
    params = replace(params, stop=stop, stop_token_ids=tuple(
        token for token in params.stop_token_ids if token in stream.token_text))
    result = run_until_stop(stream.token_ids, stream.eos_token_id, params,
                            token_text=stream.token_text, profile=profile)
    expected = oracle(stream.token_ids, stream.eos_token_id, params, profile,
                      text_of=stream.token_text.__getitem__)
    assert (len(result.output_token_ids), result.finish_reason, result.stop_reason,
            result.text) == (expected.num_output, expected.finish_reason, expected.stop_reason,
                             expected.text)


@st.composite
def token_with_stop_substrings(draw):
    """(prefix text, token text, stop strings): each stop string occurs in prefix + token text."""
    prefix = draw(st.text("ab.", max_size=3))
    token = draw(st.text("ab.", min_size=1, max_size=6))
    text = prefix + token
    stops = []
    for _ in range(draw(st.integers(2, 3))):
        end = draw(st.integers(len(prefix) + 1, len(text)))
        start = draw(st.integers(0, end - 1))
        if text[start:end] not in stops:
            stops.append(text[start:end])
    return prefix, token, tuple(stops)


@given(token_with_stop_substrings(), st.booleans(), profiles)
def test_several_stop_strings_completed_by_one_token(case, include, profile):
    """Earliest completion wins under vllm (ties: list order); list order under the others (0.19.1 too)."""
    prefix, token, stop = case
    words = {0: prefix, 1: token}
    params = SamplingParams(max_tokens=4, stop=stop, include_stop_str_in_output=include)
    result = run_until_stop([0, 1], None, params, token_text=words, profile=profile)
    expected = oracle([0, 1], None, params, profile, text_of=words.__getitem__)
    assert (result.stop_reason, result.text) == (expected.stop_reason, expected.text)

