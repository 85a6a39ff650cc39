"""Request state: one ordered status enum and token counts (no phases)."""
from __future__ import annotations

import enum

from sim.core.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request. The order is load-bearing: finished means `> PREEMPTED`."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_IGNORED = 6
    FINISHED_REPETITION = 7


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_IGNORED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_REPETITION: "repetition",
}


def is_finished(status: RequestStatus) -> bool:
    """True once the request can no longer be scheduled."""
    return status > RequestStatus.PREEMPTED


def finish_reason_of(status: RequestStatus) -> str | None:
    """The API finish_reason for a status; None while the request is alive."""
    return _FINISH_REASONS.get(status)


def finish_reason(request: "Request") -> str | None:
    """The API finish_reason of a request: "stop", "length", "abort" or None while unfinished."""
    return _FINISH_REASONS.get(request.status)


class Request:
    """A request inside the engine.

    Counts tokens: `num_prompt_tokens`, `num_computed_tokens` (KV written so far) and
    `output_token_ids`. Whether it is "in prefill" is derived: `num_computed_tokens < num_tokens - 1`
    after its first token, or below `num_prompt_tokens` before it.
    """

    __slots__ = (
        "request_id", "arrival_time", "prompt_token_ids", "num_prompt_tokens", "output_token_ids",
        "num_computed_tokens", "status", "sampling_params", "eos_token_id", "stop_reason",
        "priority", "text_state", "num_preemptions", "num_cached_tokens", "spec", "index",
        "num_spec_tokens", "is_prefill_chunk",
        "num_output_placeholders", "num_in_flight_extra", "num_stale_tokens", "client_finished",
        "kv_register_at", "kv_grow_at", "quiet_until", "kv_key", "kv_lazy", "kv_lazy_resident", "kv_lazy_blocks",
        "kv_lazy_held",
        "times_mark", "lazy_seq", "lazy_p", "lazy_f", "lazy_plan_at", "lazy_early_at", "lazy_finish_at",
    )

    def __init__(self, request_id: str, prompt_token_ids, sampling_params: SamplingParams,
                 eos_token_id: int | None, arrival_time: float = 0.0, priority: int = 0,
                 text_state=None, spec=None, index: int = 0):
        self.request_id = request_id
        self.arrival_time = arrival_time
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.stop_reason: int | str | None = None
        self.priority = priority
        self.text_state = text_state
        self.num_preemptions = 0
        self.num_cached_tokens = 0
        self.spec = spec
        self.index = index
        self.num_spec_tokens = 0  # draft tokens proposed for the next step (vLLM's spec_token_ids)
        self.is_prefill_chunk = False  # its last step stopped short of sampling (set by spec decoding)
        self.num_output_placeholders = 0  # async: tokens sampled by steps in flight, not known yet
        #: tokens scheduled in steps whose results are not applied, less the placeholders among them
        #: (`num_in_flight_tokens`): a decode row's one token is its placeholder under async scheduling,
        #: so the hot path moves one counter, not two
        self.num_in_flight_extra = 0
        self.num_stale_tokens = 0         # in-flight tokens of a step planned before a preemption
        self.client_finished = False      # the front end found a stop string; the engine's abort follows
        #: a lower bound the KV manager keeps on the token count at which this request's next block
        #: is full (to register in the prefix cache): below it a hot path skips the exact check
        #: (`KVCacheManager.registers_at`)
        self.kv_register_at = 0
        #: a bound below which this request's token count grows with no block to take nor to register
        #: (0: none known); a decode pass that inlines the KV manager's growth keeps it
        #: (`Policy._decode_in_place`), the KV manager zeroes it when it drops the request's blocks
        self.kv_grow_at = 0
        #: the engine's bound below which no output token can stop it (sim.engine.quiet; -1: none)
        self.quiet_until = -1
        #: the KV manager's deferred registration (sim.core.kv_lazy): first-block key while tracked,
        #: private (blocks marked, not hashed), LAZY blocks resident, blocks kept after its finish
        self.kv_key = None
        self.kv_lazy = False
        self.kv_lazy_resident = 0
        self.kv_lazy_blocks = None
        #: (private, preempted) the blocks it held, its marked ones first, for its own readmission's lookup
        self.kv_lazy_held = None
        #: the first slot of shared step times its token times are owed from (sim.engine.shared_times)
        self.times_mark = 1 << 62
        #: lazy row keeping (sim.engine.lazy_rows): its place in the batch's order while lazy (-1: not
        #: lazy), the steps of decodes planned and finished it is up to date with, where it is filed
        self.lazy_seq = -1
        self.lazy_p = self.lazy_f = self.lazy_plan_at = self.lazy_early_at = self.lazy_finish_at = 0

    @property
    def num_in_flight_tokens(self) -> int:
        """Tokens scheduled in steps whose results are not applied yet (placeholders included)."""
        return self.num_output_placeholders + self.num_in_flight_extra

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens so far."""
        return self.num_prompt_tokens + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """Prompt, output and draft tokens: what the scheduler lets computed tokens catch up with."""
        return self.num_prompt_tokens + len(self.output_token_ids) + self.num_spec_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self.status)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, prompt={self.num_prompt_tokens}, "
                f"computed={self.num_computed_tokens}, output={len(self.output_token_ids)})")
