"""Steps of lazy rows run in one loop: the engine loop's turns, while nothing but the rows due at a plan
happens, done without the loop's objects and calls (async scheduling, a plain SimPy environment).

A turn of `EngineProcess.loop` under async scheduling plans the next step at `now`, lets the step in
flight's time pass and ends it. While rows are lazy (sim.engine.lazy_rows) and a turn is quiet, that is:
the step in flight has no row due at its end (no stop test, no row left since it was planned), nothing
is due in SimPy before it ends, the waiting queue admits nobody (empty, no seat, or its head's refusal
stands: `Policy._refuse`), and the rows due at the next plan find a free block each, then the turn is
the rows due at the plan growing (`LazyRows._grow_due`), a price, a slot of shared token times taken and
written, SimPy's clock moved on, and a step record. `jump` runs such turns back to back, prices the
steps as one stretch (the batch is the same, its contexts grow by one a row a step), and leaves the
last step it planned in flight as a `LazyStep`, as the loop would have. Every float is added as the
loop adds it; the records are the loop's, bit for bit.
"""
from __future__ import annotations

import math

from kernels_cost_model.batch import BatchShape
from policies.base import SchedulerOutput
from sim.engine.lazy_rows import LazyStep

MAX_TURNS = 256  # turns priced at once (a jump goes on with another batch of prices)


def jump(lazy, step, env):
    """Run the quiet turns from the loop's top, `step` (a pending LazyStep) in flight; returns the step
    in flight after them (`step` itself where none was quiet)."""
    state, engine = lazy.state, lazy.engine
    if (not lazy.count or len(lazy.in_flight) != 1 or lazy.in_flight[0] is not step or engine.pending_aborts
            or any(req.num_stale_tokens for _, req in step.gone)):
        return step
    number = step.number  # the step in flight's
    limit = min(lazy.finish_due) if lazy.finish_due else math.inf  # (the first step's end with a row due)
    running, waiting, kv = state.running, state.waiting, state.kv
    n = len(running)
    if number >= limit or not lazy.ready_to_plan(n):
        return step
    queue, shared = env._queue, engine.shared_times
    horizon = queue[0][0] if queue else math.inf
    now, start, duration, slot = env._now, step.start, step.duration, step.time_slot
    gone, rows_of_step = step.gone, len(step.rows)  # (the step in flight's rows that left: stopped, aborted)
    records = []
    prices, turn = (), 0
    while number < limit:
        end = now + duration
        if end >= horizon or not admits_nothing(state, n):
            break
        following = lazy.planned + 1
        rows = lazy._due_at_plan(following, take=False)
        if rows:
            if lazy.blocks_needed(rows) > kv.free_queue.count:
                break  # a preemption: the loop's own plan
            lazy.plan_due.pop(following, None)
            lazy._grow_due(following, None, rows)
        if turn == len(prices):  # (the batch's next steps priced at once, as many as may fit before the
            # horizon at this step's price: prices only grow along a stretch)
            count = min(MAX_TURNS, limit - number, (horizon - now) / duration + 2)
            prices, turn = lazy.prices(n, lazy.context_sum, lazy._longest(following), int(count)), 0
        planned_at, next_duration, next_slot = now, prices[turn], shared.take()
        turn += 1
        lazy.context_sum += n
        lazy.planned = following
        now = end  # the step in flight ends
        lazy.finished = number
        shared.write(slot, now, running)
        decodes = rows_of_step
        if gone:  # (`LazyRows.finish`: each ends as a row that left, its token wasted)
            for _, req in gone:
                decodes -= engine._apply_other_row(req, 1, True, now, None, slot)
            gone = ()
        # (`Engine._record_step`'s row: a row that left counts as a token computed, not a decode)
        records.append((start, duration, rows_of_step - decodes, decodes, rows_of_step, rows_of_step, 0,
                        *kv.block_counts(), n, len(waiting)))
        start, duration, slot, number, rows_of_step = planned_at, next_duration, next_slot, following, n
    if not records:
        return step
    engine.steps.extend_rows([list(column) for column in zip(*records)])
    env._now = now
    engine.following_covers = True
    lazy.in_flight.popleft()
    step = LazyStep(SchedulerOutput(), BatchShape(None, None, n), duration, start, 0, None, True, slot, True,
                    number, list(running), [])
    lazy.in_flight.append(step)
    return step


def admits_nothing(state, num_running: int) -> bool:
    """Whether vLLM V0's plan admits no waiting request now (`Policy.admit_waiting`'s first tests)."""
    waiting = state.waiting
    if not waiting or num_running >= state.config.max_num_seqs:
        return True
    refused, head = state.refused, waiting[0]
    return (refused is not None and refused[0] is head and state.config.max_num_batched_tokens <= refused[1]
            and state.kv.num_free_blocks < refused[2] and refused[3] is head.kv_lazy)
