"""run_until_stop: the engine's update stage replayed over a scripted token stream."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from numbers import Integral

from kernels_cost_model.errors import is_int, require
from sim.core.fields import MAX_TOKEN_ID
from sim.core.request import Request, RequestStatus
from sim.core.sampling_params import SamplingParams
from sim.core.stop_rules import StopProfile, get_profile
from sim.core.text import TextState, as_token_text, check_token_text


@dataclass(frozen=True)
class StopResult:
    """What the client sees for one request."""

    output_token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None
    text: str
    status: RequestStatus


def make_text_state(params: SamplingParams, profile: StopProfile, token_text=None) -> TextState:
    """A fresh TextState for a request under `profile`."""
    return TextState(as_token_text(token_text), params.stop, params.include_stop_str_in_output,
                     params.min_tokens, profile.strict_min_tokens, profile.earliest_stop_string)


def run_until_stop(token_stream: Iterable[int], eos_token_id: int | None,
                   sampling_params: SamplingParams, *, prompt_len: int = 0,
                   max_model_len: int | None = None,
                   token_text: Mapping[int, str] | Callable[[int], str] | None = None,
                   profile: str | StopProfile = "vllm",
                   tokens_per_step: Iterable[int] | None = None) -> StopResult:
    """Append tokens from `token_stream` one at a time until a stop rule fires.

    Tokens after the stop are never read. A stream that runs out first gives finish_reason None.
    `tokens_per_step`: how many tokens each engine step gives the request (1 + the drafts it accepted
    under speculative decoding); None, or once it runs out, one. It matters only under a profile with
    `keeps_tokens_after_stop_string` (vLLM 0.19.1), where a stop string completed before a step's last
    token keeps the step's later tokens (read from the stream up to the step's end).
    """
    require(isinstance(token_stream, Iterable) and not isinstance(token_stream, (str, bytes, Mapping)),
            "token_stream", token_stream, "must be an iterable of token ids, e.g. [5, 9, 2]")
    require(eos_token_id is None or (is_int(eos_token_id) and 0 <= eos_token_id <= MAX_TOKEN_ID), "eos_token_id",
            eos_token_id, "must be a token id (an integer >= 0) or None (no EOS)")  # ("2" never matched: no stop)
    require(isinstance(sampling_params, SamplingParams), "sampling_params", sampling_params,
            "must be a SamplingParams, e.g. SamplingParams(max_tokens=16)")
    require(is_int(prompt_len) and prompt_len >= 0, "prompt_len", prompt_len, "must be an integer >= 0")
    require(max_model_len is None or max_model_len > prompt_len, "max_model_len", max_model_len,
            f"must exceed prompt_len={prompt_len}")
    check_token_text(token_text)
    rules = get_profile(profile)
    rules.require_min_tokens_room(sampling_params.min_tokens,
                                  None if max_model_len is None else max_model_len - prompt_len, "the request")
    req = Request("scripted", range(prompt_len), sampling_params, eos_token_id,
                  text_state=make_text_state(sampling_params, rules, token_text))
    req.status = RequestStatus.RUNNING
    tokens, sizes = iter(token_stream), iter(() if tokens_per_step is None else tokens_per_step)
    while _run_step(req, rules, tokens, next(sizes, 1), max_model_len):
        pass
    return StopResult(req.output_token_ids, req.finish_reason, req.stop_reason,
                      req.text_state.text, req.status)


def _run_step(req: Request, rules: StopProfile, tokens: Iterator[int], size: int,
              max_model_len: int | None) -> bool:
    """Append up to `size` tokens (one step's) until a stop; True if neither a stop nor the stream's end came."""
    require(isinstance(size, Integral) and size >= 1, "tokens_per_step", size, "must be whole numbers >= 1")
    output, text_before = req.output_token_ids, req.text_state.text
    first = len(output) + 1
    for i, token_id in enumerate(islice(tokens, size)):
        require(is_int(token_id) and 0 <= token_id <= MAX_TOKEN_ID, f"token_stream[{len(output)}]", token_id,
                f"must be a token id in [0, {MAX_TOKEN_ID}]")
        output.append(token_id)
        if rules.apply(req, max_model_len):
            if i + 1 < size and rules.keeps_rest_of_step(req, max_model_len):
                rules.finish_step(req, islice(tokens, size - i - 1), text_before, first, max_model_len)
            return False
    return len(output) == first - 1 + size
