"""SamplingParams: the per-request stop knobs, with vLLM's names and meaning."""
from __future__ import annotations

from dataclasses import dataclass

from kernels_cost_model.errors import require
from sim.core.fields import is_int as _is_int


def _as_tuple(value, field: str) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (str, int)):
        return (value,)
    require(isinstance(value, (list, tuple)), field, value, "must be a list")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What decides when a request stops.

    max_tokens: cap on output tokens (finish_reason "length" when it binds); None: up to
        `max_model_len` (prompt + output), as vLLM's front end fills it in.
    min_tokens: EOS, stop token ids and stop strings cannot stop a request within this many outputs
        (vLLM masks EOS and stop token ids while fewer exist: the first that can stop is the next).
    ignore_eos: the model's EOS does not stop the request (benchmark-style fixed-length runs).
    stop_token_ids: extra token ids that stop the request; stop_reason is the id.
    stop: strings that stop the request when they appear in the output text; stop_reason is the string.
    include_stop_str_in_output: keep the stop string (and EOS / stop-token text) in the text.
    repetition_detection: (max_pattern_size, min_pattern_size, min_count): stop with finish_reason
        "repetition" once the output ends in a pattern of min..max tokens repeated min_count times
        (vLLM's RepetitionDetectionParams; checked after the length rules, from min_tokens outputs on).
    """

    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    repetition_detection: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        stop_ids = _as_tuple(self.stop_token_ids, "stop_token_ids")
        stop = _as_tuple(self.stop, "stop")
        object.__setattr__(self, "stop_token_ids", stop_ids)
        object.__setattr__(self, "stop", stop)
        if isinstance(self.repetition_detection, list):
            object.__setattr__(self, "repetition_detection", tuple(self.repetition_detection))
        self._validate(stop_ids, stop)

    def _validate(self, stop_ids: tuple, stop: tuple) -> None:
        require(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
                "max_tokens", self.max_tokens, "must be an integer >= 1 or None (up to max_model_len)")
        require(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", self.min_tokens,
                "must be an integer >= 0")
        require(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
                self.min_tokens, f"must not exceed max_tokens={self.max_tokens}")
        self._validate_repetition()
        require(isinstance(self.ignore_eos, bool), "ignore_eos", self.ignore_eos, "must be a bool")
        require(isinstance(self.include_stop_str_in_output, bool), "include_stop_str_in_output",
                self.include_stop_str_in_output, "must be a bool")
        for token_id in stop_ids:  # any int, as vLLM accepts (a negative id is simply never sampled)
            require(_is_int(token_id), "stop_token_ids", stop_ids, f"entries must be integers, got {token_id!r}")
        for text in stop:
            require(isinstance(text, str) and text != "", "stop", stop,
                    f"entries must be non-empty strings, got {text!r}")



    def _validate_repetition(self) -> None:
        value = self.repetition_detection
        if value is None:
            return
        ok = (isinstance(value, tuple) and len(value) == 3 and all(_is_int(v) for v in value)
              and 0 <= value[1] <= value[0] and value[0] >= 1 and value[2] >= 2)
        require(ok, "repetition_detection", value,
                "must be (max_pattern_size >= 1, 0 <= min_pattern_size <= max_pattern_size, min_count >= 2)")

