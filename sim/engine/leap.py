"""Leap over quiet stretches: many pure-decode steps of one batch computed in one pass, exactly.

A stretch is quiet when, step after step, the same running requests each decode one token and
nothing else happens: no arrival or abort (nothing else is due in the SimPy queue before the stretch
ends), no request can stop (its next tokens are known: none is a stop candidate and no length rule
binds), no admission (the waiting queue is empty, has no seat or budget, or its head's blocks do not
fit and cannot start to fit), no preemption (every KV block the stretch crosses into is free).

Then every step's duration, every token time and every KV move is known in advance: durations from
the cost model over the growing contexts, times as a running sum (added in the same order as SimPy
adds them, so bit-identical), tokens from the streams, block allocations and prefix-cache
registrations replayed in the order the step-by-step engine makes them. Records are appended in bulk.
When any condition is not proven the engine just takes single steps (`EngineConfig.mode="step"` never
leaps: the reference).

A stretch also takes its *tail*, the one step the limit falls in, where that limit is a stop rule or a
plain arrival: the tail's tokens, times and KV moves are applied with the stretch, and when SimPy's
clock reaches its end the engine runs the stop rules on its tokens, retires the stopped requests and
records it (`Leaper.finish_tail`), as `Engine.finish_step` would. A plain arrival landing inside the
tail only queues a request, which nothing planned before it reads (`Leaper.arrival_lands_in`). Under
vLLM V1's async plans the tail's plan leaves out the rows whose last token is in flight.

Here: `Leaper`, when to try. A stretch's numbers are `sim.engine.leap_plan.StretchPlan`'s, applying it
`sim.engine.leap_apply`'s, its KV moves `sim.engine.leap_kv`'s, where one may start `sim.engine.leap_steady`'s.
"""
from __future__ import annotations

from policies.vllm import VllmV1Policy
from policies.vllm_v0 import VllmV0Policy
from sim.core.kv_cache import KVCacheManager
from sim.core.kv_stack import StackedKVCacheManager
from sim.engine.leap_apply import exact_delays
from sim.engine.leap_kv import head_may_enter
from sim.engine.leap_plan import StretchPlan
from sim.engine.leap_steady import (MAX_UNITS, MIN_UNITS, ArrivalTimeout, events_due, least_units,
                                    quiet_horizon, rows_at_rest, rows_near_stop, watch_refuses)
from sim.engine.engine import Engine, Step

#: Policies whose pure-decode step is "each running request, in order, one token" and whether they
#: try the waiting head with the whole budget (V0: prefills first) or with what decodes leave (V1).
ADMISSION_FIRST = {VllmV1Policy: False, VllmV0Policy: True}
MAX_COOLDOWN = 16  # loop turns between leap attempts after many misses
#: after a refusal by a row near its length rule, watch the rows this much further too (under overload a
#: row nears its rule every few steps: a wider watch spares passes over the rows that would refuse;
#: callgrind, issue-2x: 64 took 0.9 % fewer instructions than 16, issue-light 0.1 % more)
WATCH_UNITS = 64
ROW_MISSES_FREE = 1  # refusals by the pass over the rows in a row before any back-off (one turn per so many)
PLAIN_KV = (KVCacheManager, StackedKVCacheManager)  # the managers whose moves a leap replays


def make_leaper(engine: Engine, env=None, submits: tuple = ()) -> "Leaper | None":
    """A Leaper for `engine`, or None where leaping is not supported (hooks, custom KV managers,
    policies other than vLLM V1's and V0's, invariant checks after every step). `env` and `submits`
    (the SimPy environment and the functions arrivals hand this engine's requests to) let a stretch
    end inside the step a plain arrival lands in."""
    if (engine.hooks or type(engine.state.kv) not in PLAIN_KV or engine.config.check_invariants
            or type(engine.policy) not in ADMISSION_FIRST or engine.state.kv.num_lookahead_tokens):
        return None
    return Leaper(engine, env, submits)


class Leaper:
    """Finds and applies quiet stretches for one engine."""

    def __init__(self, engine: Engine, env=None, submits: tuple = ()):
        self.engine = engine
        self.env, self.submits = env, submits
        self.tail = None                                # the stretch whose last unit ends after the leap
        self.lag = 1 if engine.config.is_async else 0  # steps planned ahead of the one finishing
        self.steps_leapt = 0                            # steps done by leaps so far
        self.misses = 0                                 # leap attempts failed in a row
        self.cooldown = 0                               # loop turns to let pass before the next try
        self.planned_next = None                        # see take_planned
        self.row_misses = 0                             # refusals by the rows' pass in a row
        self.watch = None                               # rows near their length rule, nearest first
        self.admission_first = ADMISSION_FIRST[type(engine.policy)]
        self.skips_last_token = type(engine.policy) is VllmV1Policy  # (async: see _rows_at_rest)

    def leap(self, in_flight: Step | None, now: float):
        """From the loop's point "step k finished at `now`" (`in_flight`: step k+1 under async),
        apply a quiet stretch of U >= `least_units` steps if there is one before the horizon (the next
        event due in SimPy that does anything, `quiet_horizon`). Returns (the step now in flight,
        delays to wait) or None."""
        if self.cooldown:
            self.cooldown -= 1
            return None
        lazy = self.engine.lazy_rows
        if lazy is not None and lazy.count:
            return None  # a big batch's rows are lazy: its single steps cost less than leaps (sim.engine.lazy_rows)
        if self.watch is not None and self._still_blocked():
            self._back_off()
            return None  # a watched row is near its length rule: the pass would refuse
        horizon = quiet_horizon(self.env)
        steady = self._steady_rows(in_flight, now, horizon)
        if steady is None:
            return None  # (refused by the cheap checks or the step in flight: no back-off)
        if type(steady) is not tuple:
            if steady is not False:  # a row near its length rule: watch it and the next nearest
                engine = self.engine
                self.watch = rows_near_stop(engine.state.running, engine.quick_stop, self.lag,
                                            engine.config.max_model_len, self.skips_last_token,
                                            least_units(len(engine.state.running)) + WATCH_UNITS)
            # refused by the pass over the rows (a row near its end or its length rule, a row
            # mid-prefill): when that keeps happening (big batches under overload, where some row
            # always is), back off
            self._back_off()
            return None
        self.row_misses = 0
        self.engine.settle()  # (the stretch changes the rows: lazy keeping ends, the step in flight exposed)
        plan = StretchPlan(self, *steady, in_flight, now)
        if not plan.fix_units(horizon):
            # back off after misses found only by pricing a stretch (under overload stretches are
            # rare): whether the engine looks for a leap never changes its results, only how fast
            self.misses += 1
            self.cooldown = min(self.misses, MAX_COOLDOWN)
            return None
        self.misses = 0
        delays = exact_delays(now, plan.times, plan.finishing, plan.units)
        self.steps_leapt += plan.units
        step = plan.apply()
        # the limit that ended this stretch (the horizon, a stop, a block, a length rule) binds at
        # the very next step: the next turn is a single step, unless the stretch was cut at
        # MAX_UNITS, planned that step itself or took its tail (the turn after it may leap again)
        self.cooldown = 0 if plan.units == MAX_UNITS or plan.half or plan.tail else 1
        self.planned_next = plan.next_step
        if plan.tail:
            self.tail = plan
        return step, delays

    def _back_off(self) -> None:
        """One more refusal by the rows in a row: skip the next attempts, one turn per
        `ROW_MISSES_FREE` such refusals (at most `MAX_COOLDOWN`), in a batch big enough that a
        stretch worth a leap is several steps long (there some row is nearly always near its end)."""
        if least_units(len(self.engine.state.running)) == MIN_UNITS:
            return
        self.row_misses += 1
        self.cooldown = min(self.row_misses // ROW_MISSES_FREE, MAX_COOLDOWN)

    def finish_tail(self, now: float) -> None:
        """After the leap's timeouts, at `now`: end its tail as `Engine.finish_step` would: run the
        stop rules on the token each row sampled last, retire the stopped, record the step."""
        plan, self.tail = self.tail, None
        engine = self.engine
        if plan.may_stop:  # (the rows whose last token lies below `Request.quiet_until` pass first: it
            # cannot stop them under any profile; `stops_on_last_token` tests the others' stop candidates)
            may = [req for req in plan.rows if len(req.output_token_ids) > req.quiet_until]
            engine.retire([req for req in may if engine.stops_on_last_token(req, now)], now)
        kv, state = engine.state.kv, engine.state
        engine.steps.append_row(plan.tail_row + (kv.num_used_blocks, kv.num_cached_hashes, kv.num_free_blocks,
                                                 len(state.running), len(state.waiting)))

    def arrival_lands_in(self, start: float, end: float) -> bool:
        """Whether the only event due in SimPy up to `end` that does anything is a plain arrival
        into this engine strictly between `start` and `end` (one with no abort time, whose next
        arrival comes after `end`): it only queues a request, which no step planned before it
        reads."""
        if self.env is None:
            return False
        due = events_due(self.env, end)
        if due is None or len(due) != 1:
            return False
        when, event = due[0]
        return (type(event) is ArrivalTimeout and start < when < end and event.submit in self.submits
                and event.spec.abort_time_s is None and event.next_arrival > end)

    def take_planned(self) -> Step | None:
        """(async) The step a leap planned after the one it left in flight, once; else None."""
        step, self.planned_next = self.planned_next, None
        return step

    # ----- is the engine at a steady point? ------------------------------------------------
    def _still_blocked(self) -> bool:
        """Whether a watched row (`watch`, from the last refusal) still runs and is near its length
        rule (`watch_refuses`); where none is, the watch ends."""
        engine = self.engine
        if engine.lazy_rows is not None:  # (a watched lazy row is brought up to date)
            engine.lazy_rows.materialise_rows(self.watch)
        if watch_refuses(self.watch, engine.quick_stop, self.lag, engine.config.max_model_len,
                         self.skips_last_token, least_units(len(engine.state.running))):
            return True
        self.watch = None
        return False

    def _steady_rows(self, in_flight: Step | None, now: float, horizon: float):
        """The running requests and their numbers (`_rows_at_rest`) if the engine is at a steady
        point; None where a cheap check (cheapest first) or the step in flight refuses; where a row
        does, the row near its length rule that refused, or False for other reasons."""
        engine, lag = self.engine, self.lag
        state = engine.state
        running = state.running
        if (not running or engine.pending_aborts or engine.steps_in_flight != lag
                or (in_flight is None) != (lag == 0)
                or len(running) > state.config.max_num_batched_tokens):
            return None
        if in_flight is not None and now + in_flight.duration >= horizon:
            return None  # the step in flight itself ends at or after the next event
        if state.waiting and head_may_enter(state, len(running), self.admission_first):
            return None  # (before the pass over the step in flight: after an arrival, the usual refusal)
        lazy = engine.lazy_rows
        if lazy is not None and lazy.count:  # (the pass reads every row)
            if lazy.stop_within(least_units(len(running))):
                return False  # a row's stop test is near: the pass would refuse (or, rarely, leap short)
            lazy.materialise_all(in_flight)
        return rows_at_rest(running, engine.quick_stop, lag, engine.config.max_model_len, in_flight,
                            self.skips_last_token, least_units(len(running)))
