"""Quiet rows left alone: a step of decodes touches only the rows something happens to.

Under vLLM V0's policy a running request that only decodes gains one computed token on every step of
decodes (a step of prefills leaves it alone) and one output token when each such step ends. So its
counters are a function of two counts, the steps of decodes planned (`planned`) and finished
(`finished`): a *lazy* row keeps the counts it was last brought up to date at (`Request.lazy_p`,
`lazy_f`), and `materialise` adds what has happened since, tokens read from its stream in one slice.

Where each row must be looked at is known as a step number when it is brought up to date: at planning,
from `kv_grow_at` on (a block to take or register, `Policy._decode_in_place`'s test); at a step's end,
from `quiet_until` on (its stop test) and, when the step after it does not cover the batch, where its
tokens reach `kv_register_at` (`TokenUpdate._registers_at_end`). Rows are filed in buckets by those
numbers; each step handles its bucket's rows, in the batch's order, with the same lines the per-row
passes run, and files them again. Everything else about the step comes from aggregates: the batch is
priced from the rows' count, context sum and longest context (`decode_step_time`, the same float), the
token times from the step's shared slot (sim.engine.shared_times).

A due row that needs a block none is free for preempts, as `allocate_or_preempt` does: the victims, as
a stopped or aborted row, are brought up to date and leave lazy keeping, and the steps in flight end them
as rows that left. Whatever else reads a running row brings it up to date first: an arrival whose first
block a private row holds (its marked blocks are hashed from its tokens), a step of prefills' end, a
leap's look at the batch (`materialise_all`, and `expose` for the step in flight), the end of the run.
Whatever else would change rows ends lazy keeping (`deactivate`): a budget short of the batch, an empty
batch, a leap. In-flight steps are then given their rows and end as any step does. Quiet turns of the
engine loop run back to back in sim.engine.lazy_jump. Only `run_engine`'s plain engines keep rows lazy
(fast mode, vLLM V0, the plain KV manager, the roofline or linear cost model, no hooks nor invariant
checks): `lazy_rows_for`.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from heapq import heapify, heappop, heappush

from kernels_cost_model.batch import BatchShape
from kernels_cost_model.cost_model import RooflineCostModel
from kernels_cost_model.decode_stretch import SEQUENTIAL_SUM, decode_step_time, roofline_decode_times
from policies.base import SchedulerOutput
from policies.vllm_v0 import VllmV0Policy
from sim.core.cost import LinearCostModel
from sim.core.kv_cache import KVCacheManager
from sim.engine.step import Step

#: running requests from which a step of decodes starts keeping rows lazy, and below which it stops:
#: a small batch's quiet stretches are cheaper leapt over (sim.engine.leap), which waits while rows are
#: lazy (callgrind, docs/performance.md)
MIN_ROWS = 32
END_ROWS = 16


@dataclass(slots=True)
class LazyStep(Step):
    """A step of decodes planned over lazy rows: its rows are the running requests when it was planned
    (`rows`), its plan's lists are empty until `LazyRows.expose` fills them."""

    number: int = 0      # its place among the steps of decodes planned lazily (1, 2, ...)
    rows: list | None = None
    gone: list | None = None  # rows that left lazy keeping (stopped, aborted) while it was in flight
    pending: bool = True      # its end is `LazyRows.finish`'s (else: it was exposed for good)


def lazy_rows_for(engine) -> "LazyRows | None":
    """Lazy row keeping for `engine`, or None where it does not apply (see the module's docstring)."""
    config, kv = engine.config, engine.state.kv
    if (config.mode != "fast" or engine.hooks or config.check_invariants or engine.shared_times is None
            or type(engine.policy) is not VllmV0Policy or type(kv) is not KVCacheManager
            or not kv.grows_in_place or (kv.enable_prefix_caching and not kv.registers_at)
            or engine.strings_in_frontend):
        return None
    price = decode_pricer(engine.cost_model)
    return None if price is None else LazyRows(engine, price, stretch_pricer(engine.cost_model, price))


def decode_pricer(cost_model):
    """A function (rows, context sum, longest context) -> `cost_model.step_time` of a step of that many
    one-token decodes over such contexts, the same float; None for a cost model priced otherwise."""
    if type(cost_model) is RooflineCostModel and SEQUENTIAL_SUM:
        return lambda n, context_sum, longest: decode_step_time(cost_model, n, context_sum, longest)
    if type(cost_model) is LinearCostModel:  # (it reads only the sums: one row of each sum, the same sums)
        return lambda n, context_sum, longest: cost_model.step_time(BatchShape([n], [context_sum], n))
    return None


def stretch_pricer(cost_model, price):
    """A function (rows, context sum, longest context, count) -> the prices of `count` steps of decodes
    from such a batch on, each row one token longer a step: `price` of each, the same floats."""
    if type(cost_model) is RooflineCostModel:
        return lambda n, context_sum, longest, count: roofline_decode_times(cost_model, n, context_sum, longest,
                                                                            0, count)
    return lambda n, context_sum, longest, count: [price(n, context_sum + n * k, longest + k) for k in range(count)]


class LazyRows:
    """One engine's lazy rows: `running[:count]`, in the batch's order (`Request.lazy_seq` grows along it)."""

    def __init__(self, engine, price, prices):
        self.engine = engine
        self.price, self.prices = price, prices  # `decode_pricer`'s
        #: batch sizes lazy keeping starts and ends at: from one row where `jump` runs the quiet steps
        #: (async scheduling), else where single steps pay (`MIN_ROWS`, `END_ROWS`)
        self.min_rows, self.end_rows = (1, 1) if engine.is_async else (MIN_ROWS, END_ROWS)
        self.state = engine.state
        self.async_ = engine.is_async
        self.count = 0         # running[:count] are lazy
        self.planned = 0       # steps of decodes planned lazily so far (the last one's number)
        self.finished = 0      # the number of the last of them finished
        self.next_seq = 0
        self.context_sum = 0   # the lazy rows' computed tokens, as of `planned`
        self.offsets: list = []    # heap of (lazy_p - computed, seq, req): the longest context
        self.plan_due: dict = {}   # step number -> [(seq, req)] to look at when planning it
        #: async scheduling with prefix caching: a row's plan may register nothing while its token is in flight
        self.late_registers = self.async_ and engine.state.kv.enable_prefix_caching
        self.finish_due: dict = {}  # step number -> [(seq, req)] to look at when it ends
        self.in_flight: deque = deque()  # pending LazySteps, oldest first
        self.out = SchedulerOutput()  # the plan of the step being planned (its preempted requests)

    # ----- planning ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput | None:
        """vLLM V0's `schedule`, where a step of decodes over lazy rows returns None (then
        `plan_decodes` plans it); any other step's plan is returned (a step of prefills, which the lazy
        rows sit out; a step of decodes the per-row pass plans, lazy keeping ended; a step that only
        preempted)."""
        engine, state = self.engine, self.state
        policy, config = engine.policy, state.config
        policy.require_whole_prompt_budget(config)
        out = self.out = SchedulerOutput()
        budget = config.max_num_batched_tokens
        policy.admit_waiting(state, budget, out, whole_prompt=True)
        if out.scheduled:
            return out
        if not state.running or not self._ready(budget):
            self.deactivate()
            policy.decode_running(state, budget, out)
            return out
        self._grow_due(self.planned + 1, out)
        return None if state.running else out

    def _due_at_plan(self, number: int, take: bool = True) -> list:
        """The rows to look at when planning step `number`, in the batch's order: those filed there, and,
        unless a lazy step is in flight, those filed one plan later with this one as their early point
        (`_grow_due`). `take`: the bucket is emptied (else it is only read)."""
        bucket = (self.plan_due.pop if take else self.plan_due.get)(number, None)
        early = None if self.in_flight else self.plan_due.get(number + 1)
        if not early:
            if not bucket:
                return []
            if len(bucket) == 1:  # (the usual: one row, or none still due)
                seq, req = bucket[0]
                return [req] if req.lazy_seq == seq and req.lazy_plan_at == number else []
        rows = {seq: req for seq, req in bucket or () if req.lazy_seq == seq and req.lazy_plan_at == number}
        for seq, req in early or ():
            if req.lazy_seq == seq and req.lazy_early_at == number and req.lazy_plan_at == number + 1:
                rows[seq] = req
        if len(rows) < 2:
            return list(rows.values())
        return [req for _, req in sorted(rows.items())]  # (a row filed twice there is one row)

    def ready_to_plan(self, num_rows: int) -> bool:
        """Whether a step of decodes over `num_rows` rows can be planned lazily (the budget holds the
        batch, a batch big enough to pay)."""
        return (self.state.config.max_num_batched_tokens >= num_rows
                and num_rows >= (self.end_rows if self.count else self.min_rows))

    def _ready(self, budget: int) -> bool:
        """Whether the next step of decodes can be planned lazily (`ready_to_plan`); then every running
        row is lazy."""
        running = self.state.running
        if not self.ready_to_plan(len(running)):
            return False
        for req in running[self.count:]:
            self._join(req)
        self.count = len(running)
        return True

    def plan_decodes(self, now: float) -> LazyStep:
        """Plan the step of decodes `schedule` left to it: priced from the batch's aggregates, a slot of
        shared token times; its preempted requests leave the shared times (`Engine._queue_moves`)."""
        engine, running, out = self.engine, self.state.running, self.out
        number = self.planned + 1
        if out.preempted:
            engine._queue_moves(out, now)
        n = len(running)
        context_sum, longest = self.context_sum, self._longest(number)
        self.context_sum = context_sum + n
        self.planned = number
        engine.steps_in_flight += 1
        step = LazyStep(out, BatchShape(None, None, n), self.price(n, context_sum, longest), now, 0, None, True,
                        engine.shared_times.take(), True, number, list(running), [])
        self.in_flight.append(step)
        return step

    def _grow_due(self, number: int, out: SchedulerOutput, rows: list | None = None) -> None:
        """`Policy._decode_in_place` for the rows due at the plan of step `number` (`_due_at_plan`), each
        brought up to date as far as its growth reads: its computed tokens, and its tokens only where a
        block is registered; then its token counted as computed and in flight (`Engine._rows_advanced`)
        and the row filed again. A row that needs a block none is free for preempts
        (`_grow_preempting`). `rows`: those rows, taken from their bucket already."""
        kv, planned, finished = self.state.kv, self.planned, self.finished
        req_blocks, block_size, caching = kv.req_blocks, kv.block_size, kv.enable_prefix_caching
        hashed_get, take_next_block = kv.num_hashed_blocks.get, kv.take_next_block
        late_registers, async_, plan_due = self.late_registers, self.async_, self.plan_due
        for req in self._due_at_plan(number) if rows is None else rows:
            if req.lazy_seq < 0:
                continue  # preempted earlier in this step
            computed = req.num_computed_tokens + planned - req.lazy_p  # (its computed tokens up to date)
            total = computed + 1
            blocks = req_blocks[req]
            if total >= req.kv_grow_at:
                if total > len(blocks) * block_size and not take_next_block(blocks, total):
                    self.materialise(req)
                    self._grow_preempting(req, number, out)
                    continue
                if caching and total >= req.kv_register_at:
                    known = req.num_prompt_tokens + len(req.output_token_ids)
                    if finished > req.lazy_f:
                        known += finished - req.lazy_f
                    target = total if total < known else known
                    done = hashed_get(req, 0)
                    if target // block_size > done:
                        if not req.kv_lazy:  # (its tokens are hashed; a private row's blocks are marked)
                            self.materialise(req)
                        kv.cache_full_blocks(req, target)
                    else:
                        req.kv_register_at = (done + 1) * block_size
                grow_at = len(blocks) * block_size + 1
                req.kv_grow_at = req.kv_register_at if caching and req.kv_register_at < grow_at else grow_at
            steps = number - req.lazy_p  # (`_advance` inline)
            req.num_computed_tokens += steps
            if async_:
                req.num_output_placeholders += steps
            else:
                req.num_in_flight_extra += steps
            req.lazy_p = number
            # filed again (`_file_plan` inline: this runs for every due row). Under async scheduling with
            # prefix caching, where the next thing to happen to the row is registering its block once full
            # (`kv_grow_at` is `kv_register_at`, the end of the block after its registered ones, within its
            # blocks), the plan at that point registers nothing, and changes nothing, if the row's last token
            # is in flight then (its tokens known stop one short of the block), as it is when a lazy step is
            # in flight: the row is filed a plan later, the early point kept (`lazy_early_at`) for a plan
            # with no lazy step in flight (`_due_at_plan`).
            grow_at = req.kv_grow_at
            gap = grow_at - total
            at = number + (gap if gap > 1 else 1)
            req.lazy_early_at = -1
            if late_registers and grow_at == req.kv_register_at and grow_at <= len(blocks) * block_size \
                    and grow_at == (hashed_get(req, 0) + 1) * block_size:
                gap += 1
                if number + (gap if gap > 1 else 1) > at:
                    req.lazy_early_at, at = at, number + (gap if gap > 1 else 1)
            req.lazy_plan_at = at
            bucket = plan_due.get(at)
            if bucket is None:
                plan_due[at] = [(req.lazy_seq, req)]
            else:
                bucket.append((req.lazy_seq, req))

    def blocks_needed(self, rows: list) -> int:
        """How many of `rows` (due at the next plan) need a block at it."""
        kv, planned = self.state.kv, self.planned
        req_blocks, block_size, need = kv.req_blocks, kv.block_size, 0
        for req in rows:
            total = req.num_computed_tokens + planned - req.lazy_p + 1
            if total >= req.kv_grow_at and total > len(req_blocks[req]) * block_size:
                need += 1
        return need

    def _grow_preempting(self, req, number: int, out: SchedulerOutput) -> None:
        """`Policy.allocate_or_preempt` for a due row that needs a block none is free for: the victims
        (up to date, leaving lazy keeping) are preempted until it fits, or it is itself."""
        state, policy = self.state, self.engine.policy
        while state.kv.allocate(req, 1) is None:
            victim = policy.pick_victim(state)
            if victim is req:
                state.kv.require_ever_fits(req, req.num_computed_tokens + 1)
            self.abort(victim)
            policy.preempt(state, victim, out)
            if victim is req:
                return
        self._advance(req, number)

    def _advance(self, req, number: int) -> None:
        """Bring a due row's computed tokens up to date with step `number`, its own token counted as
        computed and in flight (`Engine._rows_advanced`); file it at its next plan."""
        steps = number - req.lazy_p
        req.num_computed_tokens += steps
        if self.async_:
            req.num_output_placeholders += steps
        else:
            req.num_in_flight_extra += steps
        req.lazy_p = number
        self._file_plan(req)

    def _longest(self, number: int) -> int:
        """The longest context before step `number` (every running row is lazy)."""
        offsets = self.offsets
        while offsets[0][2].lazy_seq != offsets[0][1]:
            heappop(offsets)  # (a row that left)
        return number - 1 - offsets[0][0]

    # ----- a step's end ------------------------------------------------------------------
    def finish(self, step: LazyStep, now: float) -> list:
        """`TokenUpdate._apply_decodes` for a lazy step (`end_step`); returns the stopped."""
        if self.in_flight.popleft() is not step:
            raise RuntimeError(f"lazy decode step {step.number} finished out of order")
        _, slot, _ = self.engine._time_slot(step, now)
        less, finished = self.end_step(step.number, step.gone, slot, now, [later.gone for later in self.in_flight])
        step.num_decode = len(step.rows) - less
        return finished

    def end_step(self, number: int, gone: list, slot: int, now: float, later: list) -> tuple[int, list]:
        """The end of lazy step `number` (its slot of shared times written): in the batch's order, its rows
        due there (a stop test, a block to register) and those that left since it was planned (`gone`:
        stopped, aborted, preempted; `TokenUpdate._apply_other_row`). The stopped leave lazy keeping (rows
        that left of the steps planned after it: `later`, their `gone` lists). Returns (rows that are not
        decodes: a first token, a row that left; the stopped)."""
        engine, finished, less = self.engine, [], 0
        self.finished = number - 1
        caching, exact = engine._registers_at_end()
        rows = self._pop_pairs(self.finish_due, number)
        if caching:
            rows = self._with_registering(rows, number)
        if gone:
            rows = sorted(rows + gone)  # (distinct places: no two rows compared)
        for _, req in rows:
            if req.lazy_seq >= 0:
                less += self._sample(req, number, caching, exact, now, finished)
            else:
                less += engine._apply_other_row(req, 1, True, now, finished, slot)
        self.finished = number
        for req in finished:
            if req.lazy_seq >= 0:  # (not a preempted row whose stale token stopped it)
                self.leave(req, later)
        return less, finished

    def _sample(self, req, number: int, caching: bool, exact: bool, now: float, finished: list) -> int:
        """`TokenUpdate._apply_decodes`'s lines for one due row at the end of step `number`; 1 where it
        sampled its first token (not a decode), else 0."""
        engine = self.engine
        self.materialise(req)
        if self.async_:
            req.num_output_placeholders -= 1
        else:
            req.num_in_flight_extra -= 1
        output = req.output_token_ids
        position = len(output)
        try:
            token = engine.stream_tokens[req.index][position]
        except (TypeError, IndexError):
            token = engine._read_ahead(req, position)
        output.append(token)
        first = 0
        if not position:
            engine.requests.first_token_time[req.index] = now
            first = 1
        if caching and (req.num_computed_tokens >= req.kv_register_at or exact):
            engine._register_written(req, position)
        req.lazy_f = number
        if position >= req.quiet_until and engine._stops_on(req, token, position, now):
            finished.append(req)
        else:
            self._file_finish(req)
        return first

    def _with_registering(self, rows: list, number: int) -> list:
        """`rows` ((place, row) pairs) and the rows of step `number` whose tokens reach `kv_register_at`
        (registered at its end when the next step does not cover the batch): those are all due at the
        next plan, where `kv_grow_at` <= `kv_register_at` has them (a row that joined after the step is
        not one of its rows: its `lazy_f` is the step's number); in the batch's order."""
        at = self.planned + 1
        candidates = self.plan_due.get(at)
        if not candidates:
            return rows
        planned, seen = self.planned, {seq for seq, _ in rows}
        more = [(seq, req) for seq, req in candidates
                if req.lazy_seq == seq and req.lazy_plan_at == at and req.lazy_f < number and seq not in seen
                and req.num_computed_tokens + planned - req.lazy_p >= req.kv_register_at]
        if not more:
            return rows
        more += rows
        more.sort()
        return more

    # ----- rows joining, leaving, brought up to date -----------------------------------------
    def _join(self, req) -> None:
        """`req`, running and up to date, becomes lazy as of the step about to be planned."""
        req.lazy_seq = seq = self.next_seq
        self.next_seq = seq + 1
        req.lazy_p = req.lazy_f = self.planned
        self.context_sum += req.num_computed_tokens
        heappush(self.offsets, (self.planned - req.num_computed_tokens, seq, req))
        self._file_plan(req)
        req.lazy_finish_at = -1  # (a number from an earlier spell of lazy keeping means nothing now)
        landing = req.num_output_placeholders  # (tokens of a step in flight that is not lazy: its prompt's)
        if req.num_stale_tokens or not (req.output_token_ids or landing):
            self._file(self.finish_due, self.planned + 1, req)
            req.lazy_finish_at = self.planned + 1
        else:
            self._file_finish(req, landing)

    def leave(self, req, gone_lists) -> None:
        """`req` stops being lazy (stopped or aborted: it is leaving the batch), up to date; `gone_lists`:
        the `gone` lists of the in-flight lazy steps it is a row of (they finish it as a row that left)."""
        self.materialise(req)
        seq, req.lazy_seq = req.lazy_seq, -1
        self.count -= 1
        self.context_sum -= req.num_computed_tokens
        for gone in gone_lists:
            gone.append((seq, req))
        if len(self.offsets) > 2 * self.count + 64:
            self.offsets = [entry for entry in self.offsets if entry[2].lazy_seq == entry[1]]
            heapify(self.offsets)

    def abort(self, req) -> None:
        """A lazy `req` is aborted (its steps in flight finish it as a row that left)."""
        self.leave(req, [step.gone for step in self.in_flight if req in step.rows])

    def materialise(self, req) -> None:
        """Bring a lazy `req`'s counters and tokens up to date with the steps planned and finished."""
        planned = self.planned - req.lazy_p
        if planned:
            req.num_computed_tokens += planned
            if self.async_:
                req.num_output_placeholders += planned
            else:
                req.num_in_flight_extra += planned
            req.lazy_p = self.planned
        ended = self.finished - req.lazy_f
        if ended > 0:
            if self.async_:
                req.num_output_placeholders -= ended
            else:
                req.num_in_flight_extra -= ended
            output = req.output_token_ids
            start = len(output)
            tokens = self.engine.stream_tokens[req.index]
            if tokens is None or len(tokens) < start + ended:
                self.engine._read_ahead(req, start + ended - 1)
                tokens = self.engine.stream_tokens[req.index]
            output.extend(tokens[start:start + ended])
            req.lazy_f = self.finished

    def materialise_all(self, in_flight: Step | None = None) -> None:
        """Bring every lazy row up to date (they stay lazy), and expose `in_flight` if it is lazy."""
        for req in self.state.running[:self.count]:
            self.materialise(req)
        if in_flight.__class__ is LazyStep:
            self.expose(in_flight)

    def stop_within(self, units: int) -> bool:
        """Whether some lazy row may be due at a step's end (a stop test) within the next `units` steps
        (filed there: an entry of a row that left since counts too, so True may be a false alarm)."""
        return bool(self.finish_due) and min(self.finish_due) <= self.planned + units

    def materialise_rows(self, rows: list) -> None:
        """Bring those of `rows` that are lazy up to date."""
        for req in rows:
            if req.lazy_seq >= 0:
                self.materialise(req)

    def before_other_end(self, step: Step) -> None:
        """Before a step other than a pending lazy one ends (a step of prefills, one exposed): its rows
        that are lazy (a row joins while its prompt's step is in flight) are brought up to date, as its
        end reads and changes them."""
        for req, _ in step.plan.scheduled:
            if req.lazy_seq >= 0:
                self.materialise(req)

    def after_other_end(self, finished: list) -> None:
        """The rows such a step stopped leave lazy keeping."""
        for req in finished:
            if req.lazy_seq >= 0:
                self.abort(req)

    def expose(self, step: LazyStep) -> None:
        """Give a lazy step its plan's rows, samples and contexts, as `Engine.plan_step` would have."""
        if step.plan.scheduled or not step.rows:
            return
        rows, before = step.rows, step.number - 1
        n = len(rows)
        step.plan.scheduled = [(req, 1) for req in rows]
        step.plan.num_decodes = n
        step.samples = [True] * n
        # a row's computed less lazy_p holds while it is lazy, and stays as it left
        step.batch = BatchShape([1] * n, [req.num_computed_tokens + before - req.lazy_p for req in rows], n)

    def deactivate(self) -> None:
        """End lazy keeping: every row up to date and no longer lazy; the steps in flight exposed, to
        finish as any step does."""
        if not self.count and not self.in_flight:
            return
        running = self.state.running
        for req in running[:self.count]:
            self.materialise(req)
        for step in self.in_flight:
            self.expose(step)
            step.pending = False
        for req in running[:self.count]:
            req.lazy_seq = -1
        self.in_flight.clear()
        self.plan_due.clear()
        self.finish_due.clear()
        self.offsets = []
        self.count = self.context_sum = 0

    # ----- buckets -----------------------------------------------------------------------
    def _file_plan(self, req) -> None:
        """File `req` (up to date with its `lazy_p`) at the plan where its tokens reach `kv_grow_at` (a row
        joining, or one `allocate` grew; `_grow_due` files the rows it grows itself, some a plan later)."""
        gap = req.kv_grow_at - req.num_computed_tokens
        at = req.lazy_p + (gap if gap > 1 else 1)
        req.lazy_plan_at, req.lazy_early_at = at, -1
        entry = (req.lazy_seq, req)
        bucket = self.plan_due.get(at)
        if bucket is None:
            self.plan_due[at] = [entry]
        else:
            bucket.append(entry)

    def _file_finish(self, req, landing: int = 0) -> None:
        """File `req` (up to date with `lazy_f`) at the step's end where its next token reaches
        `quiet_until` (every end where its tokens are always tested: `quiet_until` -1); `landing`: its
        tokens that steps in flight which are not lazy add before then."""
        gap = req.quiet_until - len(req.output_token_ids) - landing
        at = req.lazy_f + 1 + (gap if gap > 0 else 0)
        if at != req.lazy_finish_at:
            req.lazy_finish_at = at
            self._file(self.finish_due, at, req)

    @staticmethod
    def _file(buckets: dict, at: int, req) -> None:
        entry = (req.lazy_seq, req)
        bucket = buckets.get(at)
        if bucket is None:
            buckets[at] = [entry]
        else:
            bucket.append(entry)

    @staticmethod
    def _pop_pairs(buckets: dict, at: int) -> list:
        """(place, row) for the rows filed at `at` that are still lazy (a row that left keeps its
        entries), in the batch's order."""
        bucket = buckets.pop(at, None)
        if not bucket:
            return []
        rows = [(seq, req) for seq, req in bucket if req.lazy_seq == seq]
        rows.sort()
        return rows

