"""Stop rules as named profiles: the order of checks is a user-visible API.

A profile is data: the ordered token checks the engine core runs after appending a token, and how
stop strings (checked on the detokenized text) interact with them. Profiles:

- "vllm" (default): vLLM V1 today (vllm/v1/core/sched/utils.py `check_stop`, then
  vllm/v1/engine/detokenizer.py). Within the first `min_tokens` outputs only the length rules can
  stop a request (vLLM masks EOS and stop token ids there);
  EOS, then stop token ids, then length (`max_model_len` on prompt + output, `max_tokens`); then the
  detokenizer's stop strings, which win over a length cap on the same token. EOS exactly on the
  `max_tokens` boundary reports "stop". Among stop strings completed by one token, the one
  completing earliest in the text wins (ties: list order).
- "vllm-v1-2025": V1 before October 2025: the length check ran first, so that tie reports "length";
  stop strings were taken in list order (earliest-completing came with vLLM PR #49391).
- "vllm-0.19": vLLM 0.19.1: as "vllm", but below `min_tokens` nothing stops a request (length
  included), stop strings go in list order, and a stop string completed inside a step of several
  tokens (speculative decoding) keeps the step's later tokens (`keeps_tokens_after_stop_string`).
- "vllm-v0": V0's StopChecker: EOS, stop token ids, stop strings (list order), then length; stop
  strings are looked for from `min_tokens` outputs on (V1: beyond `min_tokens`) and are not looked
  for on a token that already stopped by EOS or a stop token id.

In the V1 profiles `min_tokens` gates the content checks only (EOS, stop token ids, stop strings,
repetition); the length rules always bind. `max_tokens=None` means up to `max_model_len`. Repetition
detection (`SamplingParams.repetition_detection`, vLLM V1) runs after the length rules and ends a request
with its own finish reason, "repetition" (stop_reason "repetition_detected").
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kernels_cost_model.errors import ConfigError, require
from sim.core.request import Request, RequestStatus
from sim.core.text import strings_armed

STOPPED = RequestStatus.FINISHED_STOPPED
LENGTH = RequestStatus.FINISHED_LENGTH_CAPPED
REPETITION = RequestStatus.FINISHED_REPETITION


def _eos(req: Request, max_model_len: int | None):
    if req.output_token_ids[-1] == req.eos_token_id and not req.sampling_params.ignore_eos:
        return STOPPED, None
    return None


def _stop_token_ids(req: Request, max_model_len: int | None):
    last = req.output_token_ids[-1]
    if last in req.sampling_params.stop_token_ids:
        return STOPPED, last
    return None


def _length(req: Request, max_model_len: int | None):
    if length_binds(req, len(req.output_token_ids), max_model_len):
        return LENGTH, None
    return None


def length_binds(req: Request, num_output: int, max_model_len: int | None) -> bool:
    """A length rule stops `req` once it has `num_output` output tokens (`max_tokens`, then
    `max_model_len` on prompt + output), whatever the token is. Known before sampling."""
    max_tokens = req.sampling_params.max_tokens
    if max_tokens is not None and num_output >= max_tokens:
        return True
    return max_model_len is not None and req.num_prompt_tokens + num_output >= max_model_len


def token_rules_armed(num_output: int, min_tokens: int) -> bool:
    """EOS and stop token ids can stop a request on its `num_output`-th output token: beyond
    `min_tokens`. vLLM's min-tokens logits processor (vllm/v1/sample/logits_processor/builtin.py, V0's
    sampler alike) masks them while the output has fewer than `min_tokens` tokens, so the first
    `min_tokens` outputs are never EOS or a stop token id; a scripted one there is read as a masked,
    ordinary token. Pinned by vLLM's recorded stop-rule scenarios (min_tokens_floor)."""
    return num_output > min_tokens


def _repetition(req: Request, max_model_len: int | None):
    params = req.sampling_params.repetition_detection
    if params is not None and ends_in_repetition(req.output_token_ids, *params):
        return REPETITION, "repetition_detected"
    return None


def ends_in_repetition(tokens: list[int], max_pattern_size: int, min_pattern_size: int,
                       min_count: int) -> bool:
    """The output ends in some pattern of `min_pattern_size..max_pattern_size` tokens repeated
    `min_count` times in a row (vLLM's check_sequence_repetition; size 0 means 1)."""
    for size in range(max(1, min_pattern_size), max_pattern_size + 1):
        if size * min_count > len(tokens):
            return False
        tail = tokens[-size:]
        if all(tokens[-size * (k + 1):len(tokens) - size * k] == tail for k in range(1, min_count)):
            return True
    return False


CONTENT_CHECKS = {"eos": _eos, "stop_token_ids": _stop_token_ids, "repetition": _repetition}
LENGTH_CHECKS = {"length": _length}


@dataclass(frozen=True)
class StopProfile:
    """An ordered set of stop checks.

    order: token checks in the order the engine runs them ("eos", "stop_token_ids", "length").
    strings_after_token_stop: stop strings are still looked for on a token that stopped by EOS or a
        stop token id (only matters with include_stop_str_in_output, when that text is shown).
    strict_min_tokens: stop strings need more than `min_tokens` outputs (V1) rather than at least.
    earliest_stop_string: of several stop strings completed by one token, the one completing
        earliest in the text wins (V1 today); otherwise the first in list order (V0, older V1).
    min_tokens_gates_length: below `min_tokens` outputs nothing is checked, length included (vLLM 0.19.1).
    keeps_tokens_after_stop_string: a stop string completed before the last of the tokens one step gives
        a request (several under speculative decoding) does not drop the step's later tokens: the client
        gets them, counted and timed with the step, up to the first the engine core's token checks stop,
        and the step's new text is searched once, so without `earliest_stop_string` the first string in
        list order found anywhere in it wins (vLLM 0.19.1's vllm/v1/engine/detokenizer.py,
        `BaseIncrementalDetokenizer.update`, cuts only the text; 0.33.0's drops those token ids).
    """

    name: str
    order: tuple[str, ...]
    strings_after_token_stop: bool
    strict_min_tokens: bool
    earliest_stop_string: bool = True
    min_tokens_gates_length: bool = False
    keeps_tokens_after_stop_string: bool = False

    def require_min_tokens_room(self, min_tokens: int, room: int | None, whose: str) -> None:
        """Where `min_tokens_gates_length`, a named error for a `min_tokens` above the `room` (output tokens
        max_model_len leaves; None: unbounded): the length check waits for min_tokens, so the request would
        never stop (vLLM 0.19.1's scheduler has no room to compute its next token)."""
        require(not (self.min_tokens_gates_length and room is not None and min_tokens > room), "min_tokens",
                min_tokens, f"exceeds the {room} output tokens max_model_len leaves {whose}; under stop_profile="
                f"{self.name!r} (vLLM 0.19.1) its length check waits for min_tokens, so it would never stop")

    def check_token(self, req: Request, max_model_len: int | None):
        """(status, stop_reason) decided by the token checks alone, or None."""
        num_output, min_tokens = len(req.output_token_ids), req.sampling_params.min_tokens
        if self.min_tokens_gates_length and num_output < min_tokens:
            return None  # (vLLM 0.19.1's check_stop: `num_output_tokens < min_tokens`, the new token counted)
        below_floor = not token_rules_armed(num_output, min_tokens)
        for name in self.order:
            check = CONTENT_CHECKS.get(name)
            if check is None:
                check = LENGTH_CHECKS[name]
            elif below_floor:
                continue
            result = check(req, max_model_len)
            if result is not None:
                return result
        return None

    def apply(self, req: Request, max_model_len: int | None) -> bool:
        """Run every rule on the token just appended; set status and stop_reason. True if stopped."""
        result = self.check_token(req, max_model_len)
        text = req.text_state
        if text is not None:
            token_stop = result is not None and result[0] == STOPPED
            hide = token_stop and not req.sampling_params.include_stop_str_in_output
            check = self.strings_after_token_stop or not token_stop
            found = text.append(req.output_token_ids[-1], len(req.output_token_ids), hide, check)
            if found is not None:
                result = (STOPPED, found)
        if result is None:
            return False
        req.status, req.stop_reason = result
        return True

    def stopped_by_string_alone(self, req: Request, max_model_len: int | None) -> bool:
        """`apply` just stopped `req` on a stop string, and no token check stops it on that token (the
        engine core, which does not look for stop strings in vLLM V1, would go on)."""
        return (req.status == STOPPED and isinstance(req.stop_reason, str)
                and self.check_token(req, max_model_len) is None)

    def keeps_rest_of_step(self, req: Request, max_model_len: int | None) -> bool:
        """The tokens after the one `apply` just stopped `req` on, in the same step, reach the client."""
        return self.keeps_tokens_after_stop_string and self.stopped_by_string_alone(req, max_model_len)

    def finish_step(self, req: Request, rest: Iterable[int], text_before: str, first: int,
                    max_model_len: int | None) -> None:
        """Where `keeps_rest_of_step`: append `rest`, the step's tokens after the stop string, as the engine
        core does (token checks only, up to the first that stops it), then search the step's text once
        (`TextState.search_step`; `text_before`: the text before the step, `first`: the output count of
        its first token) for the stop reason. Status stays "stop" (the front end's finish reason wins)."""
        output, token_stop = req.output_token_ids, None
        for token in rest:
            output.append(token)
            token_stop = self.check_token(req, max_model_len)
            if token_stop is not None:
                break
        hide = (token_stop is not None and token_stop[0] == STOPPED
                and not req.sampling_params.include_stop_str_in_output)
        found = req.text_state.search_step(text_before, output[first - 1:], first, hide)
        req.stop_reason = found if found is not None else req.stop_reason


PROFILES: dict[str, StopProfile] = {
    "vllm": StopProfile("vllm", ("eos", "stop_token_ids", "length", "repetition"), True, True),
    "vllm-v1-2025": StopProfile("vllm-v1-2025", ("length", "eos", "stop_token_ids", "repetition"), True,
                                True, earliest_stop_string=False),
    "vllm-v0": StopProfile("vllm-v0", ("eos", "stop_token_ids", "length"), False, False,
                           earliest_stop_string=False),
    # vLLM 0.19.1: below min_tokens `check_stop` returns before every check, length too (v1/core/sched/
    # utils.py); stop strings in list order (v1/engine/detokenizer.py `check_stop_strings`), and a stop
    # string inside a multi-token step keeps the step's later tokens (`BaseIncrementalDetokenizer.update`)
    "vllm-0.19": StopProfile("vllm-0.19", ("eos", "stop_token_ids", "length", "repetition"), True, True,
                             earliest_stop_string=False, min_tokens_gates_length=True,
                             keeps_tokens_after_stop_string=True),
}
#: The stop profile of each scheduler profile's release (sim.core.scheduler_profiles).
RELEASE_STOP_PROFILES = {"vllm-0.19": "vllm-0.19", "vllm-0.33": "vllm", "vllm": "vllm"}


def get_profile(name: str | StopProfile) -> StopProfile:
    """Look a profile up by name (a StopProfile passes through)."""
    if isinstance(name, StopProfile):
        return name
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError("stop_profile", name, f"unknown; choose from {sorted(PROFILES)}") from None


def stop_candidates(req: Request, max_model_len: int | None) -> tuple[frozenset, int]:
    """What can stop a request that has no stop strings, under every profile.

    Returns (token ids that may stop it, output count at which a length rule binds). A token not
    in the set, appended below that count, cannot stop it; the engine skips the full check then.
    """
    params = req.sampling_params
    ids = set(params.stop_token_ids)
    if not params.ignore_eos and req.eos_token_id is not None:
        ids.add(req.eos_token_id)
    limit = length_limit(req, max_model_len)
    if params.repetition_detection is not None and params.min_tokens < limit:
        limit = params.min_tokens  # any token from there on may complete a repetition (the length rule
        # still binds first where min_tokens lies beyond it)
    return frozenset(ids), limit


def length_limit(req: Request, max_model_len: int | None) -> int:
    """The output count from which `length_binds`."""
    limit = req.sampling_params.max_tokens
    if limit is None:
        limit = 1 << 62
    if max_model_len is not None:
        limit = min(limit, max_model_len - req.num_prompt_tokens)
    return limit


def must_stop_by_length(req: Request, profile: StopProfile, num_output: int,
                        max_model_len: int | None) -> bool:
    """`req` stops on its `num_output`-th output token under `profile` whatever is sampled: a
    length rule binds there (known before sampling)."""
    return "length" in profile.order and length_binds(req, num_output, max_model_len)


def can_stop_by_content(req: Request, profile: StopProfile, num_output: int) -> bool:
    """A content rule (EOS unless ignored, stop token ids, stop strings) is armed on `req`'s
    `num_output`-th output token under `profile`: whether it fires depends on what is sampled.

    Uses the floors the checks themselves use: `token_rules_armed` for the token checks and the
    stop-string floor of the profile (`strings_armed`: strict in V1, not in V0)."""
    params = req.sampling_params
    eos = "eos" in profile.order and not params.ignore_eos and req.eos_token_id is not None
    ids = "stop_token_ids" in profile.order and bool(params.stop_token_ids)
    if (eos or ids) and token_rules_armed(num_output, params.min_tokens):
        return True
    return bool(params.stop) and strings_armed(num_output, params.min_tokens, profile.strict_min_tokens)
