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
    running, waiting, kv, finish_due = state.running, state.waiting, state.kv, lazy.finish_due
    queue, shared = env._queue, engine.shared_times
    now, start, duration, slot, number = env._now, step.start, step.duration, step.time_slot, step.number
    gone, rows_of_step = step.gone, len(step.rows)  # (the step in flight's rows that left: stopped, aborted)
    preempted = len(step.plan.preempted)  # (by the step in flight's plan; none by the jump's)
    n, plan_due, free_queue, last_block = len(running), lazy.plan_due, kv.free_queue, kv.num_gpu_blocks - 1
    records, prices, turn, ends = [], (), 0, []
    ready = n and lazy.ready_to_plan(n)
    while ready:
        end = now + duration
        if (queue and queue[0][0] <= end) or (waiting and not admits_nothing(state, n)):
            break  # (an event before the step in flight ends; an admission: the loop's own turn)
        following = lazy.planned + 1
        bucket = plan_due.get(following)  # (a lazy step in flight: no row is due early, `_due_at_plan`)
        if bucket:
            if len(bucket) > free_queue.count and lazy.blocks_needed(lazy._due_at_plan(following, False)) \
                    > free_queue.count:
                break  # a preemption: the loop's own plan
            lazy._grow_due(following, None)
        if turn == len(prices):  # (the batch's next steps priced at once: as many as may fit before the
            # next event at this step's price, prices only growing along a stretch, and up to the next step
            # whose end may stop a row, which may shrink the batch)
            count = min(MAX_TURNS, (queue[0][0] - now) / duration + 2 if queue else MAX_TURNS,
                        min(finish_due) - following + 1 if finish_due else MAX_TURNS)
            prices, turn = lazy.prices(n, lazy.context_sum, lazy._longest(following), max(1, int(count))), 0
        next_slot = shared.taken  # (`SharedTimes.take` inline)
        shared.taken = next_slot + 1
        planned_at, next_duration, planned_rows = now, prices[turn], n
        turn += 1
        lazy.context_sum += n
        lazy.planned = following
        now = env._now = end  # the step in flight ends (SimPy's clock with it: a finish may schedule events)
        engine.following_covers = True
        ends.append(now)  # (the slot's time, written with the others before anything reads them)
        decodes, next_gone = rows_of_step, ()
        if gone or number in finish_due:  # (`LazyRows.finish`)
            shared.write_run(slot + 1 - len(ends), ends, running)
            ends = []
            next_gone = []
            less, finished = lazy.end_step(number, gone, slot, now, [next_gone])
            decodes -= less
            if finished:
                engine._retire(finished, now)
                n, prices, turn = len(running), (), 0  # (a smaller batch from the next plan on)
                ready = n and lazy.ready_to_plan(n)
        else:
            lazy.finished = number
        # (`Engine._record_step`'s row: a row that left counts as a token computed, not a decode)
        free = free_queue.count  # (`KVCacheManager.block_counts` inline)
        records.append((start, duration, rows_of_step - decodes, decodes, rows_of_step, rows_of_step, preempted,
                        last_block - free, len(kv.cached) + kv.lazy_blocks, free, n, len(waiting)))
        preempted = 0
        start, duration, slot, number = planned_at, next_duration, next_slot, following
        rows_of_step, gone = planned_rows, next_gone
    if not records:
        return step
    if ends:
        shared.write_run(slot - len(ends), ends, running)  # (`slot`: the step in flight's, not written)
    engine.steps.extend_rows([list(column) for column in zip(*records)])
    lazy.in_flight.popleft()
    rows = list(running)
    if gone:  # (its rows in the batch's order, those that left since included)
        rows = [req for _, req in sorted([(req.lazy_seq, req) for req in rows] + gone)]
    step = LazyStep(SchedulerOutput(), BatchShape(None, None, rows_of_step), duration, start, 0, None, True, slot,
                    True, number, rows, list(gone))
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
