"""RequestSpec: one request as a workload describes it, before the engine sees it."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from kernels_cost_model.errors import ConfigError, require
from sim.core.fields import MAX_ARRIVAL_S, MAX_TOKEN_ID, is_int, is_number
from sim.core.sampling_params import SamplingParams


#: the reasons of two checks every spec makes (formatted once: a float's `:g` costs ~0.3 us a spec)
_ARRIVAL_RULE = (f"must be a finite number in [0, {MAX_ARRIVAL_S:g}] seconds (a float clock resolves"
                 " microseconds no further)")
_ABORT_RULE = f"must be a finite number, not before arrival_time_s, at most {MAX_ARRIVAL_S:g} seconds"


@dataclass(frozen=True, slots=True, eq=False)
class RequestSpec:
    """A request to simulate.

    arrival_time_s: when the client sends it (simulated seconds).
    prompt_token_ids: int32 array (token ids let prefix caching see shared prefixes).
    output_len: natural output length: the token stream puts EOS at this position (1-based);
        None means the model never emits EOS (runs to a length cap).
    output_token_ids: an explicit scripted stream; overrides output_len when given.
    sampling_params: stop knobs (max_tokens, ignore_eos, ...).
    priority: lower value = more important (vLLM's convention), used by policy="priority".
    tenant / session_id: class and conversation labels carried into the records.
    abort_time_s: the client disconnects at this simulated time (None: never).
    return_hidden_states: the client asked for the final token's hidden state.
    """

    arrival_time_s: float
    prompt_token_ids: np.ndarray
    output_len: int | None = None
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    output_token_ids: tuple[int, ...] | None = None
    request_id: str | None = None
    priority: int = 0
    tenant: str = "default"
    session_id: str | None = None
    abort_time_s: float | None = None
    return_hidden_states: bool = False

    def __post_init__(self) -> None:
        label = self.request_id or "request"
        object.__setattr__(self, "prompt_token_ids", _token_array(self.prompt_token_ids, f"{label}.prompt_token_ids"))
        if self._plainly_valid():
            return  # (the checks below would pass: they name a fault, in this order)
        require(is_number(self.arrival_time_s) and 0 <= self.arrival_time_s <= MAX_ARRIVAL_S,
                f"{label}.arrival_time_s", self.arrival_time_s, _ARRIVAL_RULE)
        if isinstance(self.sampling_params, dict):
            object.__setattr__(self, "sampling_params",
                               _sampling_params(self.sampling_params, f"{label}.sampling_params"))
        require(isinstance(self.sampling_params, SamplingParams), f"{label}.sampling_params",
                self.sampling_params, "must be a SamplingParams (or a dict of its fields)")
        require(self.output_len is None or (is_int(self.output_len) and self.output_len >= 1),
                f"{label}.output_len", self.output_len, "must be an integer >= 1 or None")
        if self.output_token_ids is not None:
            require(isinstance(self.output_token_ids, (tuple, list, np.ndarray)), f"{label}.output_token_ids",
                    self.output_token_ids, "must be a sequence of token ids")
            ids = tuple(self.output_token_ids)
            require(all(is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in ids), f"{label}.output_token_ids",
                    ids[:8], f"must be integers in [0, {MAX_TOKEN_ID}]")
            object.__setattr__(self, "output_token_ids", ids)
        require(is_int(self.priority), f"{label}.priority", self.priority, "must be an integer")
        require(self.request_id is None or (isinstance(self.request_id, str) and self.request_id != ""),
                "request_id", self.request_id, "must be a non-empty string or None (the engine names it)")
        require(isinstance(self.tenant, str), f"{label}.tenant", self.tenant, "must be a string")
        require(self.session_id is None or isinstance(self.session_id, str), f"{label}.session_id",
                self.session_id, "must be a string or None")
        require(isinstance(self.return_hidden_states, bool), f"{label}.return_hidden_states",
                self.return_hidden_states, "must be true or false")
        require(self.abort_time_s is None or (is_number(self.abort_time_s)
                                              and self.arrival_time_s <= self.abort_time_s <= MAX_ARRIVAL_S),
                f"{label}.abort_time_s", self.abort_time_s, _ABORT_RULE)

    def _plainly_valid(self) -> bool:
        """Whether the fields are of the plain types the workloads build (a float time, Python ints,
        no scripted stream, no abort) and within their ranges: `__post_init__`'s checks then pass, and
        are skipped (their calls and formatted field names: ~0.7 % of a run's instructions)."""
        output_len, request_id, session_id = self.output_len, self.request_id, self.session_id
        return (type(self.arrival_time_s) is float and 0 <= self.arrival_time_s <= MAX_ARRIVAL_S
                and type(self.sampling_params) is SamplingParams and self.output_token_ids is None
                and (output_len is None or (type(output_len) is int and output_len >= 1))
                and type(self.priority) is int and type(self.tenant) is str
                and (request_id is None or (type(request_id) is str and request_id != ""))
                and (session_id is None or type(session_id) is str)
                and type(self.return_hidden_states) is bool and self.abort_time_s is None)

    @property
    def num_prompt_tokens(self) -> int:
        return int(self.prompt_token_ids.size)


def _sampling_params(values: dict, field: str) -> SamplingParams:
    """SamplingParams from a dict of its fields; an unknown key or a bad value is named under `field`."""
    known = [f.name for f in fields(SamplingParams)]
    for key, value in values.items():
        require(key in known, f"{field}.{key}", value, f"unknown setting; known: {known}")
    try:
        return SamplingParams(**values)
    except ConfigError as exc:
        raise ConfigError(f"{field}.{exc.field}", exc.value, exc.reason) from None


def _token_array(values, field: str) -> np.ndarray:
    """A non-empty 1-d int32 array of token ids in [0, MAX_TOKEN_ID], or a ConfigError naming `field`."""
    ids = values if isinstance(values, np.ndarray) else np.asarray(values)
    require(ids.ndim == 1 and ids.size >= 1, field, ids.size, "must be a non-empty 1-d sequence of token ids")
    if ids.dtype.kind not in "iu":  # (str(dtype) costs microseconds: built for the error only)
        require(False, field, str(ids.dtype), "token ids must be integers")
    if ids.dtype == np.int32 and int(ids.view(np.uint32).max()) <= MAX_TOKEN_ID:
        return ids  # (one reduction: a negative id, seen unsigned, lies past MAX_TOKEN_ID)
    low, high = int(ids.min()), int(ids.max())
    require(low >= 0 and high <= MAX_TOKEN_ID, field, (low, high), f"token ids must be in [0, {MAX_TOKEN_ID}]")
    return ids if ids.dtype == np.int32 else ids.astype(np.int32)
