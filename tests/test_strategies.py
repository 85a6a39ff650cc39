"""The public hypothesis strategies in workloads.strategies produce what they promise."""
from __future__ import annotations

from hypothesis import given

from sim.core.text import BYTE_EOS_TOKEN_ID
from workloads.strategies import (STOPPER_KINDS, stop_scenarios, stop_strings, text_token_ids,
                                  token_ids_of, word_streams)


@given(stop_scenarios())
def test_planted_stopper_sits_where_reported(scenario):
    """The stopper's last token is output number `stopper_at`, and it is of the stated kind."""
    assert scenario.stopper_kind in STOPPER_KINDS
    if scenario.stopper_kind == "none":
        assert scenario.stopper_at is None
        return
    last = scenario.token_ids[scenario.stopper_at - 1]
    if scenario.stopper_kind == "eos":
        assert last == scenario.eos_token_id
    elif scenario.stopper_kind == "stop_token_id":
        assert last in scenario.params.stop_token_ids
    else:
        end = scenario.stopper_at
        text = "".join(chr(token) for token in scenario.token_ids[:end])
        # a stop string ends here (cut at the front when it is longer than the output so far)
        assert any(text.endswith(stop_str[max(0, len(stop_str) - end):])
                   for stop_str in scenario.params.stop)


@given(stop_scenarios(at="max_tokens"))
def test_pinned_at_max_tokens(scenario):
    """`at="max_tokens"` plants the stopper on exactly the max_tokens-th output."""
    if scenario.stopper_at is not None:
        assert scenario.stopper_at == scenario.params.max_tokens


@given(stop_scenarios(at="cap", kinds=("eos",)))
def test_pinned_at_cap(scenario):
    """`at="cap"` plants the stopper where a length rule fires."""
    cap = scenario.params.max_tokens
    if scenario.max_model_len is not None:
        cap = min(cap, scenario.max_model_len - scenario.prompt_len)
    assert scenario.stopper_at == cap
    assert scenario.token_ids[cap - 1] == BYTE_EOS_TOKEN_ID


@given(stop_scenarios(at="min_tokens", kinds=("stop_string",)))
def test_pinned_at_min_tokens(scenario):
    """`at="min_tokens"` plants on the floor (output 1 when the floor is 0)."""
    assert scenario.stopper_at == max(1, scenario.params.min_tokens)
    assert scenario.params.stop


@given(stop_scenarios())
def test_limits_are_consistent(scenario):
    """The prompt leaves room for output under max_model_len."""
    assert scenario.prompt_len >= 0
    assert scenario.max_model_len is None or scenario.max_model_len > scenario.prompt_len


@given(stop_strings(min_count=1))
def test_stop_strings_are_distinct_and_non_empty(stop):
    """No empty strings and no duplicates, so SamplingParams accepts them."""
    assert stop and all(stop) and len(set(stop)) == len(stop)


@given(text_token_ids(with_eos=False))
def test_text_token_ids_read_as_text(tokens):
    """Without EOS every id is a character of the alphabet."""
    assert token_ids_of("".join(chr(token) for token in tokens)) == tokens


@given(word_streams())
def test_word_streams_have_text_for_every_token(stream):
    """Every id in the stream, EOS included, has an entry in token_text."""
    assert set(stream.token_ids) <= set(stream.token_text)
    assert stream.token_text[stream.eos_token_id] == "</s>"
