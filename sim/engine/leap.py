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
"""
from __future__ import annotations

import math
from bisect import bisect_left
from itertools import accumulate, repeat

import numpy as np

from kernels_cost_model.batch import BatchShape
from policies.base import SchedulerOutput
from policies.vllm import VllmV1Policy
from policies.vllm_v0 import VllmV0Policy
from sim.core.kv_cache import KVCacheManager
from sim.core.kv_stack import StackedKVCacheManager
from sim.engine.decode_times import decode_step_times
from sim.engine.leap_kv import StretchKV, head_may_enter
from sim.engine.leap_steady import (MAX_UNITS, MIN_UNITS, ArrivalTimeout, events_due, flying_rows, least_units,
                                    plan_stop, quiet_horizon, rows_at_rest, rows_near_stop, watch_refuses)
from sim.engine.engine import Engine, Step
from workloads.token_streams import FILLER_RANGE, synthetic_rows, synthetic_spans

#: Policies whose pure-decode step is "each running request, in order, one token" and whether they
#: try the waiting head with the whole budget (V0: prefills first) or with what decodes leave (V1).
ADMISSION_FIRST = {VllmV1Policy: False, VllmV0Policy: True}
SPAN_FROM = 48     # read more tokens than this per row with the stream's vectorised span
MAX_COOLDOWN = 16  # loop turns between leap attempts after many misses
WATCH_UNITS = 16  # after a refusal by a row near its length rule, watch the rows this much further too
ROW_MISSES_FREE = 2  # refusals by the pass over the rows in a row before any back-off (one turn per so many)
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
        if self.watch is not None and self._still_blocked():
            self._back_off()
            return None  # a watched row is near its length rule: the pass would refuse
        horizon = quiet_horizon(self.env)
        steady = self._steady_rows(in_flight, now, horizon)
        if steady is None:
            return None  # (refused by the cheap checks: no back-off)
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
        plan = _StretchPlan(self, *steady, in_flight, now)
        if not plan.fix_units(horizon):
            # back off after misses found only by pricing a stretch (under overload stretches are
            # rare): whether the engine looks for a leap never changes its results, only how fast
            self.misses += 1
            self.cooldown = min(self.misses, MAX_COOLDOWN)
            return None
        self.misses = 0
        delays = _exact_delays(now, plan.times, plan.finishing, plan.units)
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
        if plan.may_stop:  # (the rows whose token cannot stop them under any profile passed first)
            quick_stop = engine.quick_stop
            may = [req for req in plan.rows if req.output_token_ids[-1] in quick_stop[req.index][0]
                   or len(req.output_token_ids) >= quick_stop[req.index][1]]
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
        if watch_refuses(self.watch, engine.quick_stop, self.lag, engine.config.max_model_len,
                         self.skips_last_token, least_units(len(engine.state.running))):
            return True
        self.watch = None
        return False

    def _steady_rows(self, in_flight: Step | None, now: float, horizon: float):
        """The running requests and their numbers (`_rows_at_rest`) if the engine is at a steady
        point; None where a cheap check refuses (cheapest first); where the pass over the rows
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
        flying = None
        if in_flight is not None:
            flying = flying_rows(in_flight, running)
            if flying is None:
                return None
        rows = rows_at_rest(running, engine.quick_stop, lag, engine.config.max_model_len, flying,
                             self.skips_last_token, least_units(len(running)))
        return False if rows is None else rows  # (or the row near its length rule)


class _StretchPlan(StretchKV):
    """The numbers of one candidate stretch: units u = 1..U, each "plan step k+lag+u, then finish
    step k+u" (a sync engine plans the step it then finishes)."""

    def __init__(self, leaper: Leaper, rows: list, outputs: list, static: int, plan_static: int,
                 skips: list | None,
                 first_decodes: int, in_flight: Step | None, now: float):
        engine = leaper.engine
        self.engine, self.lag, self.rows, self.in_flight, self.now = engine, leaper.lag, rows, in_flight, now
        self.kv = engine.state.kv
        self.admission_first = leaper.admission_first
        self.num_rows = len(rows)
        self.min_units = least_units(self.num_rows)  # a shorter stretch is left to single steps
        self.static = min(static, MAX_UNITS)  # units before a length rule stops a row
        self.plan_static = plan_static        # units before a rule leaves a row out of a plan
        # per row (plain lists: a batch has tens of rows, fewer than numpy's fixed costs repay)
        self.outputs = outputs
        self.bases = [r.num_prompt_tokens + o - 1 for r, o in zip(rows, outputs)]  # tokens known - 1
        lag = self.lag
        self.computed = [base + lag for base in self.bases] if lag else self.bases
        self.first_decodes = first_decodes  # decode rows of the step in flight
        self.skips = skips   # per row 1 if it samples from unit 2 on (not in the step in flight), or None
        if skips is not None:
            self.computed = [c - skip for c, skip in zip(self.computed, skips)]
        self.leaper = leaper
        self.units = 0
        self.times: list[float] = []  # see _price
        self.half = 0            # 1: the step after the stretch is planned by it too
        self.tail = False        # its last unit ends after the leap's timeouts (Leaper.finish_tail)
        self.may_stop = False    # ... and a row may stop on the token it samples
        self.left = ()           # rows the tail's plan leaves out (async: `_plan_leaves_rows`)
        self.next_step = None    # (async) that step, for the loop to run after the one in flight
        self.tokens: list[list[int]] | None = None  # per row, from the first unit on

    # ----- how many units are quiet -------------------------------------------------------
    def fix_units(self, horizon: float) -> bool:
        """Fix U: the least of every limit (each a bound on the quiet units, so any order is exact);
        the cheap ones first, the step prices of U last. Then one unit more where only a stop rule
        or a plain arrival bounds the stretch (`_take_tail`)."""
        # units with no stop: before a length rule binds, before a candidate token is sampled (read
        # for one unit more: the unit a stop may end the stretch at)
        units = self._token_limit(self._horizon_bound(self.static + 1, horizon))
        safe = min(units, self.static)
        if safe < self.min_units:
            return False
        # blocks for one unit more: the plan of the step after the stretch (`half`) or its tail
        kv_units = self._kv_limit(safe + 1)
        units = min(safe, kv_units)
        if units < self.min_units:
            return False
        units = self._time_limit(units, horizon)
        if units < self.min_units:
            return False
        self.units = units
        # plan the step after the stretch too ("half a unit") where its plan is as quiet as the
        # stretch's: its blocks fit, the head stays out, no length rule bars a row from it (a stop
        # on the tokens that step samples is the engine's business when it finishes it)
        quiet_plan = units < MAX_UNITS and kv_units > units and self.plan_static > units
        if (quiet_plan or self._plan_leaves_rows(units, kv_units)) and self._take_tail(safe, horizon):
            self.half = 0
        else:
            self.half, self.left = int(quiet_plan), ()
        units = self.units
        self.times = self.times[:units + 1]
        if self.half and len(self.planned) <= units:
            self.planned += decode_step_times(self.engine.cost_model, self.computed, len(self.planned),
                                              units + 1 - len(self.planned))
        last = units + self.half
        if self.events and self.events[-1][0] > last:
            self.events = [event for event in self.events if event[0] <= last]
        if self.left:
            self._leave_out_of_last_plan()
        return True

    def _plan_leaves_rows(self, units: int, kv_units: int) -> bool:
        """(async, vLLM V1) Whether the plan at unit U+1 leaves rows out by a length rule (V1 does not
        schedule a request whose step in flight samples its last token) and is otherwise as quiet
        as the stretch: the tail may then take it with those rows out (`left`: their indices). Only
        with nobody waiting (the rows left out would leave budget to the waiting head)."""
        if not self.lag or units >= MAX_UNITS or kv_units <= units or self.plan_static != units:
            return False
        if self.skips is not None or self.engine.state.waiting or not self.leaper.skips_last_token:
            return False  # (`plan_stop` is exact for vLLM V1's plans only)
        engine, leaper = self.engine, self.leaper
        max_model_len = engine.config.max_model_len
        self.left = [r for r, (req, o) in enumerate(zip(self.rows, self.outputs))
                     if plan_stop(req, self.lag, max_model_len, leaper.skips_last_token) - o - 1 == units]
        return True

    def _leave_out_of_last_plan(self) -> None:
        """The rows left out of the tail's plan take no block in it; their blocks full with known
        tokens are registered when the tail ends, after the plan's moves (in row order), as
        `Engine._apply_rows` does under async scheduling."""
        last, left = self.units, set(self.left)
        events = [event for event in self.events if event[0] < last or event[1] not in left]
        events += [event for event in self.events if event[0] == last and event[1] in left and event[2]]
        self.events = events

    def _take_tail(self, safe: int, horizon: float) -> bool:
        """Take unit U+1 too, as the stretch's tail, where what bounds U is a stop rule (a row may
        stop on the tail's token: the engine checks once it ends, `Leaper.finish_tail`) or the
        horizon, when the event due is a plain arrival into this engine that lands inside the tail
        and nothing else is due before it ends (the tail was planned before the arrival; the step
        after it is not planned here). Sets `units`, `tail` (the tail's rows may stop)."""
        units = self.units + 1
        self._price(units)
        end = self.times[units]
        if end >= horizon and not self.leaper.arrival_lands_in(self.times[units - 1], end):
            return False
        self.units, self.tail, self.may_stop = units, True, units > safe
        return True

    def _horizon_bound(self, units: int, horizon: float) -> int:
        """At most `units`, about as many as fit before `horizon` at the first step's price (steps
        only grow dearer as contexts grow): bounds the tokens and blocks looked at; `_time_limit`
        then fixes the exact count."""
        planned = decode_step_times(self.engine.cost_model, self.computed, 0, 1)
        self.planned = planned
        first = planned[0] if not self.lag else min(planned[0], self.in_flight.duration)
        return units if first <= 0 else int(min(units, (horizon - self.now) / first + 2))

    def _time_limit(self, units: int, horizon: float) -> int:
        """Units whose finish comes strictly before `horizon` (`_price` fills the times)."""
        chunk = units + 1  # (one more: the tail's, `_take_tail`)
        while True:
            self._price(min(units + 1, len(self.planned) + chunk))
            if len(self.planned) > units or self.times[-1] >= horizon:
                break
            chunk = max(16, 2 * chunk)
        return min(units, bisect_left(self.times, horizon) - 1)

    def _price(self, units: int) -> None:
        """Price units 1..`units` at least: fills `self.planned` (durations of the steps planned at
        units 1..), `self.finishing` (of the steps finishing at units 1..) and `self.times` (t_k,
        t_k+1, ...: the finish times, summed in order as SimPy adds them)."""
        planned = self.planned
        if len(planned) < units:
            planned += decode_step_times(self.engine.cost_model, self.computed, len(planned), units - len(planned))
        elif len(self.times) > units:
            return
        finishing = planned if not self.lag else [self.in_flight.duration] + planned[:-1]
        self.finishing, self.times = finishing, list(accumulate(finishing, initial=self.now))

    def _token_limit(self, units: int) -> int:
        """Units before any row's next token could stop it; keeps the tokens of those units (or,
        for synthetic streams, reads them only when the stretch is taken: `_append_tokens`)."""
        engine = self.engine
        streams = engine.streams
        synthetic = [getattr(streams[req.index], "synthetic", None) for req in self.rows]
        if None not in synthetic:
            return self._synthetic_token_limit(units, synthetic)
        tokens = []
        most = units  # tokens read per row: one more than the units found quiet so far (the tail's)
        skips = self.skips or [0] * self.num_rows  # a row that skips unit 1 samples token i at unit i + 2
        for req, start, skip in zip(self.rows, self.outputs, skips):
            stream = streams[req.index]
            stop_ids = engine.quick_stop[req.index][0]
            count = min(units + 1, most)
            span = getattr(stream, "span", None) if count > SPAN_FROM else None
            if span is not None:
                span_tokens = span(start, start + count)
                hits = np.flatnonzero(np.isin(span_tokens, tuple(stop_ids))) if stop_ids else ()
                if len(hits) and hits[0] + skip < units:
                    units = int(hits[0]) + skip
                row = span_tokens.tolist()
            else:
                row = [stream(p) for p in range(start, start + count)]
                if not stop_ids.isdisjoint(row):
                    units = min(units, skip + next(i for i, token in enumerate(row) if token in stop_ids))
            tokens.append(row)
            if units < self.min_units:
                return units
        self.tokens = tokens
        return units

    def _synthetic_token_limit(self, units: int, synthetic: list) -> int:
        """`_token_limit` for rows that all read synthetic streams. Their tokens are filler ids
        (`FILLER_RANGE`) but for the EOS id at the EOS position: where no row's stop set holds a
        filler id, a row can stop only at its EOS position, and only if its stop set holds the EOS
        id (known without reading a token). Else every row's tokens are read at once and the
        stretch ends before the first token any row may stop on (a token in any row's stop set: a
        few units too early at worst, which costs only speed)."""
        quick_stop = self.engine.quick_stop
        stop_sets = [quick_stop[req.index][0] for req in self.rows]
        candidates = set().union(*stop_sets)
        if not any(token in FILLER_RANGE for token in candidates):
            skips = self.skips or [0] * self.num_rows  # (as in `_token_limit`)
            for (_, eos_position, eos_id), start, stop_ids, skip in zip(synthetic, self.outputs, stop_sets, skips):
                if start <= eos_position < start + units - skip and eos_id in stop_ids:
                    units = eos_position - start + skip
            self.synthetic = synthetic
            return units
        tokens = synthetic_spans(synthetic, np.array(self.outputs, dtype=np.int64), units)
        if candidates:
            hits = np.flatnonzero(np.isin(tokens, tuple(candidates)).any(axis=0))
            if len(hits):
                units = int(hits[0])
        self.tokens = tokens[:, :units + 1].tolist()  # (with the tail's, `fix_units`)
        return units

    def _read_synthetic(self, units: int) -> None:
        """The tokens of `units` units of rows on synthetic streams (a slice of the filler cycle each)."""
        self.tokens = synthetic_rows(self.synthetic, self.outputs, units)

    def _append_tokens(self, units: int) -> None:
        """Append the tokens rows sample in units 1..`units` (one fewer for a row that skips unit 1)."""
        if self.tokens is None:
            self._read_synthetic(units)
        if self.skips is None:
            for req, row in zip(self.rows, self.tokens):
                req.output_token_ids.extend(row[:units])
            return
        for req, row, skip in zip(self.rows, self.tokens, self.skips):
            req.output_token_ids.extend(row[:units - skip])

    def _truncate_tokens(self) -> None:
        for req, start in zip(self.rows, self.outputs):
            del req.output_token_ids[start:]

    # ----- applying it ----------------------------------------------------------------------
    def apply(self) -> Step | None:
        """Do the stretch: KV events, tokens, token times, counters, step records. Returns the
        step in flight afterwards (async) or None."""
        units, rows = self.units, self.rows
        self._advance_rows()
        self._record_steps(self._replay_kv())  # (the hashes read the tokens appended)
        if not self.lag:
            return self._plan_next() if self.half else None
        for r in self.left:  # (not in the step now in flight)
            req = rows[r]
            req.num_computed_tokens -= 1
            req.num_in_flight_extra = req.num_output_placeholders = 0
        in_flight = self._decode_step(units)
        if not in_flight.plan.scheduled:  # every row left out: nothing planned (`Engine.plan_step`)
            self.engine.steps_in_flight -= 1
            return None
        if self.half:
            self.next_step = self._plan_next()
        return in_flight

    def _advance_rows(self) -> None:
        """Per row, in one pass: append the tokens it samples in units 1..U (one fewer for a row
        that skips unit 1) and their times, count its computed tokens; under async scheduling, count
        the step now in flight's token (in flight, a placeholder) and a first token's time (the end
        of unit 1)."""
        units, times = self.units, self.times
        if self.tokens is None:
            self._read_synthetic(units)
        finish_times = times[1:]  # (the floats themselves: a running request's times are a list)
        requests = self.engine.requests
        token_times, first_token = requests.token_times, requests.first_token_time
        lag = self.lag
        for req, row, o, skip in zip(self.rows, self.tokens, self.outputs, self.skips or repeat(0)):
            req.output_token_ids.extend(row[:units - skip])
            req.num_computed_tokens += units
            column = token_times[req.index]
            if column is not None:
                column.extend(finish_times[skip:] if skip else finish_times)
            if lag:
                req.num_output_placeholders = 1  # the step now in flight's token (in flight, a placeholder)
                req.num_in_flight_extra = 0
                if not o:
                    first_token[req.index] = times[1]

    def _decode_step(self, unit: int) -> Step:
        """The step planned at `unit` (1-based): every row 1 token, sampling (but the rows left out
        of the tail's plan: then priced as `Engine.plan_step` prices it)."""
        context = [c + unit - 1 for c in self.computed]
        rows = self.rows
        duration = self.planned[unit - 1]
        if self.left and unit == self.units:
            left = set(self.left)
            context = [c for r, c in enumerate(context) if r not in left]
            rows = [req for r, req in enumerate(rows) if r not in left]
        batch = BatchShape([1] * len(rows), context, len(rows))
        if len(rows) < self.num_rows:
            duration = self.engine.cost_model.step_time(batch)
        start = self.now if unit == 1 else self.times[unit - 1]
        return Step(SchedulerOutput([(req, 1) for req in rows]), batch, duration, start, 0, [True] * len(rows))

    def _plan_next(self) -> Step:
        """Plan the step after the stretch (at its end, as `Engine.plan_step` would: its KV moves
        are replayed already) and count its tokens as computed and in flight (`Engine._advance`)."""
        lag = self.lag
        for req in self.rows:
            req.num_computed_tokens += 1
            req.num_output_placeholders += lag  # (under async its token in flight is a placeholder)
            req.num_in_flight_extra += 1 - lag
        self.engine.steps_in_flight += 1
        return self._decode_step(self.units + 1)

    def _record_steps(self, snapshots) -> None:
        """Append the records of the U steps that finished (steps k+1 .. k+U); the tail's (a pure
        decode of every row) is kept for when it ends (`Leaper.finish_tail`: its counters then)."""
        units, lag, times = self.units, self.lag, self.times
        steps = self.engine.steps
        starts = [self.now] + times[1:units]   # `now` kept as it is (SimPy starts at int 0)
        if lag:
            starts = [self.in_flight.start] + starts[:-1]
        finishing = self.finishing[:units]
        b = self.num_rows
        used, cached, free = snapshots
        if self.tail:
            self.tail_row = (starts.pop(), finishing.pop(), 0, b, b, b, 0)
            units -= 1
            del used[units:], cached[units:], free[units:]
        prefill, batch, sampled = [0] * units, [b] * units, [b] * units
        decode = [b] * units
        if lag:  # the step in flight: prefill rows, rows of requests finished since, and decodes
            first = self.in_flight
            decode[0] = self.first_decodes
            prefill[0] = sum(first.batch.num_new_tokens) - decode[0]
            batch[0] = len(first.plan.scheduled)
            sampled[0] = first.batch.num_sampled
        columns = (starts, finishing, prefill, decode, batch, sampled, [0] * units,
                   used, cached, free, [b] * units, [len(self.engine.state.waiting)] * units)
        steps.extend_rows(columns)


def _exact_delays(now: float, times: list, finishing: list, units: int) -> list[float]:
    """Delays whose SimPy timeouts end exactly at times[units]: one if a single delay lands there
    bit for bit, else one per step (each added as the step-by-step loop adds it)."""
    end = times[units]
    delay = end - now
    for _ in range(4):
        if now + delay == end:
            return [delay]
        delay = math.nextafter(delay, math.inf if now + delay < end else -math.inf)
    return finishing[:units]
