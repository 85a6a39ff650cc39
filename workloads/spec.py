"""RequestSpec: one request as a workload describes it, before the engine sees it."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernels_cost_model.errors import require
from sim.core.sampling_params import SamplingParams


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
        ids = np.asarray(self.prompt_token_ids, dtype=np.int32)
        object.__setattr__(self, "prompt_token_ids", ids)
        label = self.request_id or "request"
        require(ids.ndim == 1 and ids.size >= 1, f"{label}.prompt_token_ids", ids.size,
                "must be a non-empty 1-d sequence of token ids")
        require(self.arrival_time_s >= 0, f"{label}.arrival_time_s", self.arrival_time_s, "must be >= 0")
        require(self.output_len is None or self.output_len >= 1, f"{label}.output_len",
                self.output_len, "must be >= 1 or None")
        require(self.abort_time_s is None or self.abort_time_s >= self.arrival_time_s,
                f"{label}.abort_time_s", self.abort_time_s, "must not precede arrival_time_s")

    @property
    def num_prompt_tokens(self) -> int:
        return int(self.prompt_token_ids.size)
