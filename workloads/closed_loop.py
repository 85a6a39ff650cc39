"""Closed-loop clients: N users, each sends its next request when the previous one finishes
plus a think time (what max_concurrency load generators do).

Everything random is drawn per request index before the run, so request i has the same lengths,
prompt ids and think time whatever order the engine finishes requests in.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from kernels_cost_model.errors import require
from sim.core.fields import MAX_NUM_REQUESTS, check_types
from sim.core.sampling_params import SamplingParams
from workloads.delays import ThinkTime, as_think_time
from workloads.presets import resolve_lengths
from workloads.spec import RequestSpec
from workloads.tokens import hashed_tokens


@dataclass(frozen=True, slots=True)
class ClosedLoopClients:
    """`num_users` concurrent users sending `num_requests` requests in total.

    think_time: seconds (exponential mean) or a ThinkTime, after each answer.
    ramp_up_s: user k starts at k * ramp_up_s / num_users (0: all at once).
    """

    num_users: int
    num_requests: int
    lengths: object = "sharegpt"
    think_time: ThinkTime | float = 0.0
    ramp_up_s: float = 0.0
    max_tokens: int | None = None
    ignore_eos: bool = True
    priority: int = 0
    tenant: str = "default"

    def __post_init__(self) -> None:
        check_types(self)
        require(self.num_users >= 1, "num_users", self.num_users, "must be an integer >= 1")
        require(0 <= self.num_requests <= MAX_NUM_REQUESTS, "num_requests", self.num_requests,
                f"must be an integer in [0, {MAX_NUM_REQUESTS}]")
        require(self.ramp_up_s >= 0, "ramp_up_s", self.ramp_up_s, "must be >= 0")
        require(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", self.max_tokens,
                "must be an integer >= 1 or None")
        object.__setattr__(self, "think_time", as_think_time(self.think_time))
        resolve_lengths(self.lengths)

    def process(self, env, submit, rng: np.random.Generator):
        """SimPy process: runs the users until all requests have finished."""
        length_rng, token_rng, think_rng = rng.spawn(3)
        prompts, outputs = resolve_lengths(self.lengths).sample(length_rng, self.num_requests)
        thinks = self.think_time.sample(think_rng, self.num_requests)
        salt = int(token_rng.integers(0, 2**62))
        counter = itertools.count()

        def user(k: int):
            if self.ramp_up_s:
                yield env.timeout(k * self.ramp_up_s / self.num_users)
            while (i := next(counter)) < self.num_requests:
                yield submit(self._spec(i, env.now, int(prompts[i]), int(outputs[i]), salt))
                yield env.timeout(float(thinks[i]))

        users = [env.process(user(k)) for k in range(min(self.num_users, max(self.num_requests, 1)))]
        yield env.all_of(users)

    def _spec(self, i: int, now: float, prompt_len: int, output_len: int, salt: int) -> RequestSpec:
        keys = (np.uint64(i) << np.uint64(32)) + np.arange(prompt_len, dtype=np.uint64)
        params = SamplingParams(max_tokens=self.max_tokens or output_len, ignore_eos=self.ignore_eos)
        return RequestSpec(arrival_time_s=now, prompt_token_ids=hashed_tokens(keys, salt), output_len=output_len,
                           sampling_params=params, request_id=f"req-{i}", priority=self.priority,
                           tenant=self.tenant, session_id=None)
