"""Multi-turn chat sessions: the workload that makes prefix caching matter.

Turn k's prompt = turn k-1's prompt + its answer (scripted filler ids ending in EOS, as the
engine will emit them) + the new user message. Closed loop (`process`): the next turn is sent
when the previous answer finishes plus a think time. Open loop (`iter_requests`): it arrives at
the previous arrival + an assumed response time (assumed_ttft_s + assumed_tpot_s * output) + think.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from kernels_cost_model.errors import require
from sim.core.fields import check_types
from sim.core.sampling_params import SamplingParams
from workloads.arrivals import Poisson, arrival_times
from workloads.delays import ThinkTime, as_think_time
from workloads.lengths import LogNormal, Uniform
from workloads.spec import RequestSpec
from workloads.tokens import DEFAULT_EOS_TOKEN_ID, answer_tokens, random_prompts


@dataclass(frozen=True, slots=True)
class Turn:
    """One planned turn: the user's new tokens, the scripted answer, the think time after it."""

    user_ids: np.ndarray
    answer_ids: tuple[int, ...]
    think_s: float


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """A conversation: id, start time and turns (the random part, drawn before any run)."""

    session_id: str
    start_s: float
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class SessionWorkload:
    """`num_sessions` conversations starting per `session_arrivals`.

    turns: turns per session; first_prompt / user_text / output: token lengths of the first
    message, later messages and answers. max_model_len ends a session before a turn whose prompt
    plus answer would not fit.
    """

    num_sessions: int
    session_arrivals: object = field(default_factory=lambda: Poisson(1.0))
    turns: object = field(default_factory=lambda: Uniform(2, 6))
    first_prompt: object = field(default_factory=lambda: LogNormal.from_mean_cv(400, 1.0, 4, 4096))
    user_text: object = field(default_factory=lambda: LogNormal.from_mean_cv(100, 1.0, 2, 2048))
    output: object = field(default_factory=lambda: LogNormal.from_mean_cv(250, 0.8, 2, 2048))
    think_time: ThinkTime | float = 10.0
    eos_token_id: int = DEFAULT_EOS_TOKEN_ID
    max_model_len: int | None = None
    assumed_ttft_s: float = 0.5
    assumed_tpot_s: float = 0.03
    priority: int = 0
    tenant: str = "chat"

    def __post_init__(self) -> None:
        check_types(self)
        require(self.num_sessions >= 0, "num_sessions", self.num_sessions, "must be an integer >= 0")
        require(self.eos_token_id >= 0, "eos_token_id", self.eos_token_id, "must be an integer >= 0")
        require(hasattr(self.session_arrivals, "sample"), "session_arrivals", self.session_arrivals,
                "must be an arrival process such as Poisson(2.0)")
        for name in ("turns", "first_prompt", "user_text", "output"):
            value = getattr(self, name)
            require(hasattr(value, "sample"), name, value, "must be a length distribution such as Uniform(2, 8)")
        require(self.max_model_len is None or self.max_model_len >= 2, "max_model_len", self.max_model_len,
                "must be >= 2 or None")
        require(self.assumed_ttft_s >= 0, "assumed_ttft_s", self.assumed_ttft_s, "must be >= 0")
        require(self.assumed_tpot_s >= 0, "assumed_tpot_s", self.assumed_tpot_s, "must be >= 0")
        object.__setattr__(self, "think_time", as_think_time(self.think_time))

    def plan(self, rng: np.random.Generator) -> list[SessionPlan]:
        """The sessions' random content, vectorised; same rng state, same plan."""
        arrival_rng, turn_rng, length_rng, token_rng, think_rng = rng.spawn(5)
        starts = arrival_times(self.session_arrivals, arrival_rng, self.num_sessions)
        counts = self.turns.sample(turn_rng, self.num_sessions)
        total = int(counts.sum())
        firsts = np.cumsum(counts) - counts
        user_lens = self.user_text.sample(length_rng, total)
        user_lens[firsts] = self.first_prompt.sample(length_rng, self.num_sessions)
        outputs = self.output.sample(length_rng, total)
        thinks = self.think_time.sample(think_rng, total).tolist()
        users = random_prompts(token_rng, user_lens)
        return [SessionPlan(f"session-{j}", float(starts[j]),
                            tuple(Turn(users[g], answer_tokens(g, int(outputs[g]), self.eos_token_id), thinks[g])
                                  for g in range(firsts[j], firsts[j] + counts[j])))
                for j in range(self.num_sessions)]

    def turn_specs(self, plan: SessionPlan) -> Iterator[tuple[RequestSpec, float]]:
        """(spec, think_s) per turn, arrival times unset (0); the caller stamps them."""
        history = np.empty(0, dtype=np.int32)
        for turn in plan.turns:
            prompt = np.concatenate([history, turn.user_ids])
            n_out = len(turn.answer_ids)
            if self.max_model_len is not None and prompt.size + n_out > self.max_model_len:
                return
            params = SamplingParams(max_tokens=n_out, ignore_eos=False)
            yield RequestSpec(0.0, prompt, n_out, params, output_token_ids=turn.answer_ids,
                              priority=self.priority, tenant=self.tenant, session_id=plan.session_id), turn.think_s
            history = np.concatenate([prompt, np.asarray(turn.answer_ids, dtype=np.int32)])

    def process(self, env, submit, rng: np.random.Generator):
        """Closed loop: each turn after the previous answer finished plus the think time."""
        ids = itertools.count()

        def session(plan: SessionPlan):
            yield env.timeout(plan.start_s)
            for spec, think in self.turn_specs(plan):
                yield submit(replace(spec, arrival_time_s=env.now, request_id=f"req-{next(ids)}"))
                yield env.timeout(think)

        yield env.all_of([env.process(session(p)) for p in self.plan(rng)])

    def iter_requests(self, rng: np.random.Generator) -> Iterator[RequestSpec]:
        """Open loop: arrival-sorted turns of all sessions, response times assumed."""
        merged = heapq.merge(*(self._open_loop(p, j) for j, p in enumerate(self.plan(rng))),
                             key=lambda item: item[0])
        for i, (_, spec) in enumerate(merged):
            yield replace(spec, request_id=f"req-{i}")

    def _open_loop(self, plan: SessionPlan, j: int) -> Iterator[tuple[tuple, RequestSpec]]:
        t = plan.start_s
        for k, (spec, think) in enumerate(self.turn_specs(plan)):
            yield (t, j, k), replace(spec, arrival_time_s=t)
            t += self.assumed_ttft_s + self.assumed_tpot_s * spec.output_len + think
