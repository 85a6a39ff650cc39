"""The last-token problem: which requests finish this step, and what returning the final token's
hidden state costs.

The hidden state of a step's token is produced in the forward pass, before sampling decides
whether that token is the last one. Before the step runs, `plan_extraction` sorts every request
that will sample into

- `definite_last`: a length rule (`max_tokens`, `max_model_len`) stops it whatever is sampled;
- `speculative`: a content rule is armed at that output position (EOS unless ignored, stop token
  ids, stop strings; `min_tokens` respected, with the profile's floor for stop strings), so it
  may stop;
- `none`: it cannot stop this step.

It asks the engine's own stop profile (`sim.core.stop_rules.must_stop_by_length`,
`can_stop_by_content`), so plan and engine cannot drift apart: every request that stops is in
`definite_last` or `speculative`, and every `definite_last` request stops, unless (async scheduling)
the token of the step in flight stopped it first: its row in this step is wasted, as vLLM's is.
Under async scheduling a row's token is its output position after the placeholders of the step in
flight.

Two strategies for requests with `RequestSpec.return_hidden_states`, as engine hooks (`sim.core.hooks`):

- `HybridExtraction`: copy the hidden-state rows of `definite_last` and `speculative` requests that
  asked to the host every step (`HiddenStatesCost`), drop the speculative rows that did not stop.
  Costs step time and a buffer; never delays a completion.
- `PostSamplingPrefill`: after a request that asked stops, run a prefill over its whole sequence
  (prompt + output, recomputed from scratch), batched into the next engine step; its completion
  waits for the end of that step.

`sim.whatif.last_token_whatif.compare_strategies` runs both against a run without hidden states.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import require
from sim.core.hooks import EngineHook
from sim.core.request import Request
from sim.core.stop_rules import StopProfile, can_stop_by_content, must_stop_by_length

#: Llama-3-8B's hidden size, matching `LinearCostModel`'s defaults (used when a cost model has no ModelSpec).
DEFAULT_HIDDEN_SIZE = 4096
#: Llama-3-8B's KV bytes per token (32 layers x 8 KV heads x 128 dims x K,V x 2 B).
DEFAULT_KV_BYTES_PER_TOKEN = 131072


@dataclass(frozen=True)
class ExtractionPlan:
    """One step's last-token plan, in batch row order. Requests that do not sample are in none of
    the three (a mid-prefill chunk produces no token)."""

    definite_last: tuple[Request, ...] = ()
    speculative: tuple[Request, ...] = ()
    none: tuple[Request, ...] = ()

    @property
    def extracted(self) -> tuple[Request, ...]:
        """Rows the hybrid strategy extracts: definite_last then speculative."""
        return self.definite_last + self.speculative

    def ids(self, kind: str) -> set[str]:
        """Request ids of one kind: "definite_last", "speculative" or "none"."""
        return {req.request_id for req in getattr(self, kind)}


def plan_extraction(scheduled, profile: StopProfile, max_model_len: int | None) -> ExtractionPlan:
    """Sort the requests of a schedule (`[(request, num_new_tokens)]`, before the step runs) that
    will sample this step (the catch-up rule) by whether their next token may be the last."""
    definite, speculative, none = [], [], []
    for req, n in scheduled:
        num_output = len(req.output_token_ids) + req.num_output_placeholders  # (async: tokens in flight)
        if req.num_computed_tokens + n < req.num_prompt_tokens + num_output:
            continue  # mid-prefill chunk: samples nothing
        after = num_output + 1
        if must_stop_by_length(req, profile, after, max_model_len):
            definite.append(req)
        elif can_stop_by_content(req, profile, after):
            speculative.append(req)
        else:
            none.append(req)
    return ExtractionPlan(tuple(definite), tuple(speculative), tuple(none))


def wants_hidden_states(req: Request) -> bool:
    """The client asked for the final token's hidden state (`RequestSpec.return_hidden_states`)."""
    return req.spec is not None and req.spec.return_hidden_states


@dataclass(frozen=True)
class HiddenStatesCost:
    """What moving hidden states to the host costs.

    hidden_size, dtype_bytes, kv_bytes_per_token: None = from the cost model's ModelSpec
        (`cost_model.model`, as `make_cost_model` builds), else Llama-3-8B's (4096, 2, 128 KiB).
    d2h_bytes_per_s: device-to-host copy bandwidth; 50 GB/s is pinned-memory PCIe Gen5 x16
        (64 GB/s per direction on paper, H100 SXM's host link).
    fixed_s: per step with any row extracted: a gather kernel, the copy's launch and its sync
        (an estimate: ~5 us launch + ~15 us for a small synchronous copy).
    """

    hidden_size: int | None = None
    dtype_bytes: int | None = None
    kv_bytes_per_token: int | None = None
    d2h_bytes_per_s: float = 50e9
    fixed_s: float = 20e-6

    def __post_init__(self) -> None:
        for name in ("hidden_size", "dtype_bytes", "kv_bytes_per_token"):
            value = getattr(self, name)
            require(value is None or (isinstance(value, int) and value >= 1), name, value,
                    "must be an integer >= 1 or None")
        require(self.d2h_bytes_per_s > 0, "d2h_bytes_per_s", self.d2h_bytes_per_s, "must be > 0")
        require(self.fixed_s >= 0, "fixed_s", self.fixed_s, "must be >= 0")

    def resolve(self, cost_model) -> "HiddenStatesCost":
        """This cost with every None filled from `cost_model`'s ModelSpec (or the defaults)."""
        spec = getattr(cost_model, "model", None)
        hidden = getattr(spec, "hidden_size", DEFAULT_HIDDEN_SIZE)
        dtype = getattr(spec, "dtype_bytes", 2)
        kv = DEFAULT_KV_BYTES_PER_TOKEN
        if spec is not None and hasattr(spec, "num_kv_heads"):
            from kernels_cost_model import kv_bytes_per_token
            kv = kv_bytes_per_token(spec, getattr(cost_model, "tensor_parallel_size", 1))
        return HiddenStatesCost(self.hidden_size or int(hidden), self.dtype_bytes or int(dtype),
                                self.kv_bytes_per_token or int(kv), self.d2h_bytes_per_s, self.fixed_s)

    @property
    def row_bytes(self) -> int:
        """One hidden state: hidden_size x dtype bytes (resolved costs only)."""
        return self.hidden_size * self.dtype_bytes

    def extraction_s(self, rows: int) -> float:
        """Seconds to gather `rows` hidden states and copy them to the host (0 for no rows)."""
        if rows == 0:
            return 0.0
        return self.fixed_s + rows * self.row_bytes / self.d2h_bytes_per_s


@dataclass
class HiddenStatesStats:
    """What a strategy added over a run.

    extra_s: seconds added to steps; rows: hidden-state rows copied to the host; wasted_rows:
    speculative rows of requests that did not stop (hybrid); prefill_tokens: tokens recomputed
    (post-sampling prefill); peak_bytes: the largest per-step device memory the strategy needed
    (extraction buffer, plus the recompute's KV for post-sampling prefill).
    """

    steps: int = 0
    extra_s: float = 0.0
    rows: int = 0
    definite_rows: int = 0
    speculative_rows: int = 0
    wasted_rows: int = 0
    prefill_tokens: int = 0
    peak_bytes: int = 0
    asked: list = field(default_factory=list)  # indexes of stopped requests that asked


class _CostedHook(EngineHook):
    def __init__(self, cost: HiddenStatesCost | None):
        self._cost_spec = cost or HiddenStatesCost()
        self.cost: HiddenStatesCost | None = None
        self.stats = HiddenStatesStats()

    def _resolved(self, engine) -> HiddenStatesCost:
        if self.cost is None:
            self.cost = self._cost_spec.resolve(engine.cost_model)
        return self.cost


class HybridExtraction(_CostedHook):
    """Extract hidden states for `definite_last` and `speculative` rows of requests that asked;
    add the copy to the step's time. `keep_plans=True` logs `(plan, ids that stopped)` per step."""

    def __init__(self, cost: HiddenStatesCost | None = None, keep_plans: bool = False):
        super().__init__(cost)
        self.plans: list[tuple[ExtractionPlan, frozenset]] | None = [] if keep_plans else None
        self._in_flight: deque = deque()  # (plan, rows extracted) per step planned and not ended, oldest first
        self._stopped: set[Request] = set()  # stopped at the end of the step ending now

    def on_plan(self, engine, step) -> None:
        plan = plan_extraction(step.plan.scheduled, engine.stop_profile, engine.config.max_model_len)
        extracted = [r for r in plan.extracted if wants_hidden_states(r)]
        self._in_flight.append((plan, extracted))  # (steps end in the order they are planned)
        if not extracted:
            return
        definite = sum(1 for r in plan.definite_last if wants_hidden_states(r))
        cost, s = self._resolved(engine), self.stats
        seconds = cost.extraction_s(len(extracted))
        step.duration += seconds
        s.steps += 1
        s.extra_s += seconds
        s.rows += len(extracted)
        s.definite_rows += definite
        s.speculative_rows += len(extracted) - definite
        s.peak_bytes = max(s.peak_bytes, len(extracted) * cost.row_bytes)

    def on_stop(self, engine, req, now: float) -> bool:
        self._stopped.add(req)
        if wants_hidden_states(req):
            self.stats.asked.append(req.index)
        return False

    def on_step_end(self, engine, now: float) -> None:
        """The step planned first ends: its extracted rows whose request did not stop in it were wasted
        (a speculative row that did not stop; under async scheduling also one whose request the step
        before stopped)."""
        plan, extracted = self._in_flight.popleft()
        stopped, self._stopped = self._stopped, set()
        self.stats.wasted_rows += sum(1 for r in extracted if r not in stopped)
        if self.plans is not None:
            self.plans.append((plan, frozenset(r.request_id for r in stopped)))


class PostSamplingPrefill(_CostedHook):
    """Hold back the completion of a stopped request that asked; prefill its whole sequence in the
    next engine step (batched with whatever that step runs) and complete it when that step ends.

    The recompute's KV is counted in `stats.peak_bytes` but not taken from the simulated KV cache
    (its blocks are freed at the stop, as usual); its tokens are not charged to the step budget.
    """

    def __init__(self, cost: HiddenStatesCost | None = None):
        super().__init__(cost)
        self.pending: list[Request] = []
        self.in_flight: list[Request] = []

    def has_work(self) -> bool:
        return bool(self.pending)

    def on_stop(self, engine, req, now: float) -> bool:
        if not wants_hidden_states(req):
            return False
        self.pending.append(req)
        self.stats.asked.append(req.index)
        return True

    def on_plan(self, engine, step) -> None:
        if not self.pending:
            return
        rows, self.pending, self.in_flight = self.pending, [], self.pending
        tokens = [req.num_tokens for req in rows]
        batch = step.batch
        wider = BatchShape(batch.num_new_tokens + tokens, batch.num_context_tokens + [0] * len(rows),
                           batch.num_sampled)
        cost, model = self._resolved(engine), engine.cost_model
        seconds = model.step_time(wider) - model.step_time(batch) + cost.extraction_s(len(rows))
        step.batch = wider
        step.duration += seconds
        s = self.stats
        s.steps += 1
        s.extra_s += seconds
        s.rows += len(rows)
        s.prefill_tokens += sum(tokens)
        s.peak_bytes = max(s.peak_bytes, sum(tokens) * cost.kv_bytes_per_token + len(rows) * cost.row_bytes)

    def on_step_end(self, engine, now: float) -> None:
        for req in self.in_flight:
            engine.complete(req, now)
        self.in_flight = []


STRATEGIES = {"hybrid": HybridExtraction, "post_sampling_prefill": PostSamplingPrefill}


def make_hook(strategy: str, cost: HiddenStatesCost | None = None) -> EngineHook:
    """A fresh hook for `strategy` ("hybrid" or "post_sampling_prefill")."""
    require(strategy in STRATEGIES, "strategy", strategy, f"must be one of {sorted(STRATEGIES)}")
    return STRATEGIES[strategy](cost)
