"""Named examples: vLLM's own stop test cases, re-expressed over scripted token streams.

Each test names the vLLM test it pins (paths in the vllm-project/vllm repository). The texts and
vocabularies are our own; the behaviour is vLLM's. Streams use a small word vocabulary where one
token carries several characters, as real tokenizers do.
"""
from __future__ import annotations

import pytest

from sim import ConfigError, PROFILES, SamplingParams, StopProfile, get_profile, run_until_stop
from sim.core.text import BYTE_EOS_TOKEN_ID, find_stop_string

EOS = 2
VOCAB = {
    EOS: "<eos>", 10: "Our", 11: " robot", 12: " waters", 13: " the", 14: " garden", 15: " every",
    16: " morning", 17: ".", 18: " It", 19: " never", 20: " forgets", 21: " plants", 42: "<ctl>",
}
SENTENCE = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 13, 21, 17]
TEXT = "".join(VOCAB[token] for token in SENTENCE)


def run(tokens, params, profile="vllm", **kwargs):
    """Replay over the word vocabulary."""
    return run_until_stop(tokens, EOS, params, token_text=VOCAB, profile=profile, **kwargs)


def ids(text: str) -> list[int]:
    """Byte-tokenizer ids."""
    return [ord(char) for char in text]


# --- tests/detokenizer/test_check_stop_strings.py (which stop string wins) ------------------


@pytest.mark.parametrize("stop", [("me", "ran"), ("ran", "me")])
@pytest.mark.parametrize("include", [False, True])
def test_earliest_completing_stop_string_wins_whatever_the_list_order(stop, include):
    """Pins test_earliest_completing_stop_wins_regardless_of_list_order and
    test_earliest_completing_stop_include_in_output: one token completes two stop strings."""
    params = SamplingParams(stop=stop, include_stop_str_in_output=include)
    result = run_until_stop([0, 1], None, params, token_text={0: "we ", 1: "ran home"})
    assert result.stop_reason == "ran"
    assert result.text == ("we ran" if include else "we ")


def test_completion_position_beats_start_position():
    """Pins test_completion_position_not_start_position: the shorter, later-starting string that
    completes first wins."""
    result = run_until_stop([0], None, SamplingParams(stop=("xyz", "y")), token_text={0: "xyz"})
    assert (result.stop_reason, result.text) == ("y", "x")


@pytest.mark.parametrize("stop, winner, text", [(("pq", "q"), "pq", ""), (("q", "pq"), "q", "p")])
def test_ties_on_completion_go_to_list_order(stop, winner, text):
    """Pins test_ties_broken_by_list_order: two stop strings completing on one character."""
    result = run_until_stop(ids("pq"), BYTE_EOS_TOKEN_ID, SamplingParams(stop=stop))
    assert (result.stop_reason, result.text) == (winner, text)


@pytest.mark.parametrize("profile", ["vllm-v1-2025", "vllm-v0"])
def test_older_engines_take_stop_strings_in_list_order(profile):
    """Before vLLM PR #49391 (and in V0's StopChecker.check_stop_strings) the first stop string
    in list order that matched anywhere in the new text won."""
    result = run_until_stop([0, 1], None, SamplingParams(stop=("me", "ran")), profile=profile,
                            token_text={0: "we ", 1: "ran home"})
    assert (result.stop_reason, result.text) == ("me", "we ran ho")


def test_find_stop_string_unit_cases():
    """Pins test_single_stop_in_window_unchanged and test_no_match_and_empty_inputs_return_none."""
    assert find_stop_string("all done.", 1, (".",)) == (".", 8)
    assert find_stop_string("hello", 5, ("zzz",)) is None
    assert find_stop_string("hello", 0, ("h",)) is None
    assert find_stop_string("hello", 5, ()) is None


# --- tests/detokenizer/test_stop_strings.py (end-to-end stop strings and stop token ids) -----


@pytest.mark.parametrize("include, text", [(False, TEXT[:TEXT.index(".")]),
                                           (True, TEXT[:TEXT.index(".") + 1])])
def test_stop_basic(include, text):
    """Pins _stop_basic: a one-token stop string, with and without include_stop_str_in_output."""
    result = run(SENTENCE, SamplingParams(max_tokens=50, stop=("."),
                                          include_stop_str_in_output=include))
    assert (result.text, result.stop_reason, result.finish_reason) == (text, ".", "stop")


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_several_tokens(include):
    """Pins _stop_multi_tokens: the stop string straddles three tokens and ends mid-token."""
    stop = "forgets the pla"
    result = run(SENTENCE, SamplingParams(max_tokens=50, stop=(stop, "weeds"),
                                          include_stop_str_in_output=include))
    start = TEXT.index(stop)
    assert result.stop_reason == stop
    assert result.text == TEXT[:start + len(stop) if include else start]
    assert result.output_token_ids == SENTENCE[:SENTENCE.index(21) + 1]


@pytest.mark.parametrize("include, text", [(False, "Our robot waters the gar"),
                                           (True, "Our robot waters the garde")])
def test_stop_string_ending_inside_a_token(include, text):
    """Pins _stop_partial_token: the match ends mid-token; the text is cut inside that token."""
    result = run(SENTENCE, SamplingParams(max_tokens=50, stop=("de",),
                                          include_stop_str_in_output=include))
    assert (result.text, result.stop_reason) == (text, "de")
    assert result.output_token_ids == SENTENCE[:5]


@pytest.mark.parametrize("include, text", [(False, "Our robot waters the"),
                                           (True, "Our robot waters the garden")])
def test_stop_token_id_with_text(include, text):
    """Pins _stop_token_id: a stop token id's text is shown only with include_stop_str_in_output;
    stop_reason is the id."""
    result = run(SENTENCE, SamplingParams(max_tokens=50, stop_token_ids=[14],
                                          include_stop_str_in_output=include))
    assert (result.text, result.stop_reason, result.finish_reason) == (text, 14, "stop")


# --- tests/detokenizer/test_stop_checker.py and tests/v1/engine/test_output_processor.py ------


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("ignore_eos", [False, True])
@pytest.mark.parametrize("include", [False, True])
def test_stop_on_eos_token(profile, ignore_eos, include):
    """Pins test_stop_checker.py::test_stop_on_eos_token (V0) and, for V1, the EOS cases of
    test_output_processor.py::test_stop_token: text, then EOS with visible text, min_tokens=1.
    With ignore_eos the request is still running when the stream ends."""
    tokens = SENTENCE[:7] + [EOS]
    params = SamplingParams(max_tokens=16, min_tokens=1, ignore_eos=ignore_eos,
                            include_stop_str_in_output=include)
    result = run(tokens, params, profile=profile)
    body = "".join(VOCAB[token] for token in SENTENCE[:7])
    if ignore_eos:
        assert (result.finish_reason, result.text) == (None, body + "<eos>")
    else:
        assert (result.finish_reason, result.text) == ("stop", body + ("<eos>" if include else ""))
    assert result.output_token_ids == tokens


@pytest.mark.parametrize("stopper, ignore_eos", [(42, False), (EOS, False), (EOS, True)])
@pytest.mark.parametrize("include", [False, True])
def test_two_control_tokens_after_the_text(stopper, ignore_eos, include):
    """Pins test_output_processor.py::test_stop_token: text followed by two identical control
    tokens (EOS or a stop token id). The first stops the request; with ignore_eos both are text
    and the request runs to its max_tokens."""
    tokens = SENTENCE[:5] + [stopper, stopper]
    params = SamplingParams(max_tokens=len(tokens), ignore_eos=ignore_eos, stop_token_ids=[42],
                            include_stop_str_in_output=include)
    result = run(tokens, params)
    body, control = "Our robot waters the garden", VOCAB[stopper]
    if ignore_eos:
        assert (result.finish_reason, result.text) == ("length", body + 2 * control)
    else:
        assert result.finish_reason == "stop"
        assert result.text == body + (control if include else "")
        assert result.output_token_ids == tokens[:6]


@pytest.mark.parametrize("include", [False, True])
def test_first_of_several_stop_strings_in_the_text(include):
    """Pins test_output_processor.py::test_stop_string: the request stops at the first occurrence
    in the text of any stop string, and finish_reason is "stop"."""
    stops = ("plants", "every morning", "the")
    result = run(SENTENCE, SamplingParams(max_tokens=50, stop=stops,
                                          include_stop_str_in_output=include))
    assert (result.stop_reason, result.finish_reason) == ("the", "stop")
    assert result.text == "Our robot waters " + ("the" if include else "")


# --- tests/detokenizer/test_min_tokens.py (vLLM PR #22014) -----------------------------------


@pytest.mark.parametrize("min_tokens, stop, text", [
    (0, None, TEXT),
    (0, "e", "Our robot wat"),
    (4, "e", "Our robot waters the gard"),
    (5, "e", "Our robot waters the garden "),
])
def test_min_tokens_with_stop_string(min_tokens, stop, text):
    """Pins test_min_tokens_with_stop: stop strings in the first min_tokens tokens' text are not
    looked for; the first one after the floor stops the request."""
    result = run(SENTENCE, SamplingParams(max_tokens=len(SENTENCE), min_tokens=min_tokens,
                                          stop=stop))
    assert result.text == text


# --- tests/v1/core/test_scheduler.py::test_stop_via_update_from_output -----------------------


def test_scheduler_stop_on_eos_keeps_eos_in_output():
    """Case 1: EOS stops the request; EOS is its one output token (it counts as output)."""
    result = run_until_stop([EOS, 10, 11], EOS, SamplingParams(max_tokens=10))
    assert (result.output_token_ids, result.finish_reason) == ([EOS], "stop")


def test_scheduler_stop_on_stop_token_drops_later_tokens():
    """Case 2: a stop token id stops the request; tokens after it are never produced."""
    result = run_until_stop([10, 42, 12], EOS, SamplingParams(max_tokens=10,
                                                               stop_token_ids=[42, 43]),
                            token_text=VOCAB)
    assert (result.output_token_ids, result.stop_reason) == ([10, 42], 42)


def test_scheduler_stop_on_max_tokens():
    """Case 3: output is cut at exactly max_tokens with finish_reason "length"."""
    result = run_until_stop([10, 11, 12], EOS, SamplingParams(max_tokens=2), token_text=VOCAB)
    assert (result.output_token_ids, result.finish_reason) == ([10, 11], "length")


def test_scheduler_ignore_eos_continues_past_eos():
    """Case 4: with ignore_eos the request runs on past EOS."""
    result = run_until_stop([EOS, 10, 11], EOS, SamplingParams(max_tokens=10, ignore_eos=True),
                            token_text=VOCAB)
    assert (result.output_token_ids, result.finish_reason) == ([EOS, 10, 11], None)


# --- check_stop order: the EOS-on-max_tokens tie (vllm/v1/core/sched/utils.py) --------------


@pytest.mark.parametrize("profile, reason", [("vllm", "stop"), ("vllm-v1-2025", "length"),
                                             ("vllm-v0", "stop")])
def test_eos_exactly_on_max_tokens(profile, reason):
    """check_stop today tests EOS before the length cap; before October 2025 the cap came first."""
    result = run([10, 11, EOS], SamplingParams(max_tokens=3), profile=profile)
    assert (len(result.output_token_ids), result.finish_reason) == (3, reason)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_stop_string_beats_length_cap_on_the_same_token(profile):
    """The detokenizer's stop string overrides a "length" finish from the engine core (V1), and
    V0 checks stop strings before the caps."""
    result = run(SENTENCE, SamplingParams(max_tokens=4, stop=("the",)), profile=profile)
    assert (result.finish_reason, result.stop_reason, result.text) == ("stop", "the",
                                                                       "Our robot waters ")


@pytest.mark.parametrize("profile", sorted(set(PROFILES) - {"vllm-0.19"}))
def test_min_tokens_does_not_lift_max_model_len(profile):
    """Our design: min_tokens gates EOS, stop ids and stop strings only; length rules bind."""
    params = SamplingParams(max_tokens=10, min_tokens=8)
    result = run([EOS] * 12, params, profile=profile, prompt_len=5, max_model_len=8)
    assert (len(result.output_token_ids), result.finish_reason) == (3, "length")


def test_under_vllm_0_19_min_tokens_gates_the_length_checks_too():
    """vLLM 0.19.1's check_stop returns while num_output_tokens < min_tokens, length included: at
    min_tokens == max_tokens it stops there by length; with min_tokens beyond what max_model_len leaves
    it would never stop, which is named (the engine names it at the request's arrival)."""
    both = SamplingParams(max_tokens=3, min_tokens=3)
    assert (len(run([5] * 10, both, profile="vllm-0.19").output_token_ids)) == 3
    with pytest.raises(ConfigError, match="min_tokens=8"):
        run([EOS] * 12, SamplingParams(max_tokens=10, min_tokens=8), profile="vllm-0.19", prompt_len=5,
            max_model_len=8)


# --- profiles are data --------------------------------------------------------------------


def test_get_profile_by_name_and_passthrough():
    """Names resolve to the shipped profiles; a StopProfile passes through unchanged."""
    assert get_profile("vllm") is PROFILES["vllm"]
    custom = StopProfile("custom", ("length", "eos", "stop_token_ids"), False, False)
    assert get_profile(custom) is custom


def test_unknown_profile_names_the_field_and_value():
    """An unknown name raises ConfigError naming stop_profile and the value."""
    with pytest.raises(ConfigError) as caught:
        get_profile("vllm-v2")
    assert (caught.value.field, caught.value.value) == ("stop_profile", "vllm-v2")


def test_run_until_stop_rejects_a_prompt_that_fills_the_model():
    """max_model_len must leave room for at least one output token."""
    with pytest.raises(ConfigError) as caught:
        run_until_stop([1], EOS, SamplingParams(), prompt_len=4, max_model_len=4)
    assert (caught.value.field, caught.value.value) == ("max_model_len", 4)


def test_the_engine_names_a_min_tokens_beyond_max_model_len_under_vllm_0_19():
    import numpy as np
    from sim import SimulationConfig, simulate
    from workloads.spec import RequestSpec
    spec = RequestSpec(0.0, np.arange(100, dtype=np.int32) + 100, output_len=60,
                       sampling_params=SamplingParams(min_tokens=50, max_tokens=60))
    config = SimulationConfig(engine={"num_gpu_blocks": 64, "max_model_len": 128, "stop_profile": "vllm-0.19",
                                      "usage_context": "llm_class"}, deployment={"cost_model": "linear"})
    with pytest.raises(ConfigError, match="min_tokens=50: exceeds the 28 output tokens max_model_len leaves request 'req-0'"):
        simulate(config, workload=[spec])
    within = simulate(config.replace(engine={"stop_profile": "vllm"}), workload=[spec]).requests
    assert list(within["num_output_tokens"]) == [28]


@pytest.mark.parametrize("call, named", [
    (lambda: run_until_stop([5, 6, EOS], "2", SamplingParams()), "eos_token_id='2': must be a token id"),
    (lambda: run_until_stop([5, 6, EOS], EOS, {"max_tokens": 5}), "sampling_params={'max_tokens': 5}: must be a"
                                                                   " SamplingParams"),
    (lambda: run_until_stop(None, EOS, SamplingParams()), "token_stream=None: must be an iterable of token ids"),
    (lambda: run_until_stop("abc", EOS, SamplingParams()), "token_stream='abc': must be an iterable of token ids"),
    (lambda: run_until_stop([5, -1], EOS, SamplingParams()), "token_stream[1]=-1: must be a token id in [0, "),
    (lambda: run_until_stop([5.5], EOS, SamplingParams()), "token_stream[0]=5.5: must be a token id"),
    (lambda: run_until_stop([5], EOS, SamplingParams(), prompt_len=True), "prompt_len=True: must be an integer"),
])
def test_run_until_stop_names_a_bad_argument(call, named):
    """An EOS id given as "2" never matched, so the stream ran to its end with no stop and no error; a
    dict of sampling params, a None stream or a float token raised AttributeError / TypeError from inside."""
    with pytest.raises(ConfigError) as info:
        call()
    assert str(info.value).startswith(named)
