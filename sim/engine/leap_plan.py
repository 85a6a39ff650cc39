"""The numbers of one candidate quiet stretch: how many steps are quiet (tokens, KV, time), then its
tail. Applying it is `StretchApply`'s (sim.engine.leap_apply), its KV side `StretchKV`'s
(sim.engine.leap_kv); `Leaper` (sim.engine.leap) builds one per attempt.
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate, repeat

import numpy as np

from sim.engine.decode_times import decode_step_times
from sim.engine.leap_apply import StretchApply
from sim.engine.leap_kv import StretchKV
from sim.engine.leap_steady import MAX_UNITS, least_units, plan_stop
from sim.engine.quiet import ALWAYS_CHECK, quiet_until
from sim.engine.step import Step
from workloads.token_streams import synthetic_spans

SPAN_FROM = 48     # read more tokens than this per row with the stream's vectorised span
PRICED_AHEAD = 6   # steps priced with the first (most stretches then need one call of the cost model, not two)


class StretchPlan(StretchApply, StretchKV):
    """The numbers of one candidate stretch: units u = 1..U, each "plan step k+lag+u, then finish
    step k+u" (a sync engine plans the step it then finishes). Built by a `Leaper` (sim.engine.leap),
    whose engine, lag and admission order it reads."""

    def __init__(self, leaper, rows: list, outputs: list, computed: list, static: int, plan_static: int,
                 skips: list | None, first_decodes: int, quiet_units: int, in_flight: Step | None, now: float):
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
        # computed tokens, the context of unit 1: prompt + outputs - 1 (tokens known - 1), + lag
        # (its token in flight) unless it skips unit 1
        self.computed = computed
        self.first_decodes = first_decodes  # decode rows of the step in flight
        self.skips = skips   # per row 1 if it samples from unit 2 on (not in the step in flight), or None
        self.quiet_units = quiet_units  # units before a row's `quiet_until` (see `_quiet_token_limit`)
        self.leaper = leaper
        self.units = 0
        self.times: list[float] = []  # see _price
        self.half = 0            # 1: the step after the stretch is planned by it too
        self.tail = False        # its last unit ends after the leap's timeouts (Leaper.finish_tail)
        self.may_stop = False    # ... and a row may stop on the token it samples
        self.left = ()           # rows the tail's plan leaves out (async: `_plan_leaves_rows`)
        self.next_step = None    # (async) that step, for the loop to run after the one in flight
        self.tokens: list[list[int]] | None = None  # per row, from the first unit on (`_row_tokens`)

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
        then fixes the exact count. Prices the first `PRICED_AHEAD` steps."""
        planned = decode_step_times(self.engine.cost_model, self.computed, 0, min(units, PRICED_AHEAD))
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
        """Units before any row's next token could stop it; keeps the tokens of those units where
        it reads them (`tokens`; else they are read when the stretch is taken: `_row_tokens`)."""
        if self.quiet_units > 0:  # (`_quiet_token_limit`'s answer, found by the pass over the rows)
            return min(units, self.quiet_units)
        quiet = self._quiet_token_limit(units)
        if quiet is not None:
            return quiet
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

    def _quiet_token_limit(self, units: int) -> int | None:
        """`_token_limit` where every row knows the first output position whose token the stop test
        must see (`Request.quiet_until`, sim.engine.quiet: a synthetic stream with no stop id among
        its filler ids): the stretch ends before any row samples there. Its length rule's position
        binds no earlier than `static` already does, so only the stop ids' positions bound the
        stretch (as reading the tokens would). None where a row's tokens must be read (`ALWAYS_CHECK`).
        The tokens are read when the stretch is taken. (Where every row's `quiet_until` lies ahead
        of its tokens, `rows_at_rest` has found the answer: `quiet_units`.)"""
        engine = self.engine
        for req, o, skip in zip(self.rows, self.outputs, self.skips or repeat(0)):
            quiet = req.quiet_until
            if quiet < o:
                if quiet == ALWAYS_CHECK:
                    return None
                # behind the row's tokens (a leap's tail sampled there and the row went on): from here
                quiet = req.quiet_until = quiet_until(engine.streams[req.index], engine.quick_stop[req.index], o)
            if quiet - o + skip < units:
                units = quiet - o + skip
        return units

    def _synthetic_token_limit(self, units: int, synthetic: list) -> int:
        """`_token_limit` for rows that all read synthetic streams where a row's stop set holds a
        filler id (`FILLER_RANGE`): every row's tokens are read at once and the stretch ends before
        the first token any row may stop on (a token in any row's stop set: a few units too early at
        worst, which costs only speed)."""
        quick_stop = self.engine.quick_stop
        candidates = set().union(*(quick_stop[req.index][0] for req in self.rows))
        tokens = synthetic_spans(synthetic, np.array(self.outputs, dtype=np.int64), units)
        hits = np.flatnonzero(np.isin(tokens, tuple(candidates)).any(axis=0))
        if len(hits):
            units = int(hits[0])
        self.tokens = tokens[:, :units + 1].tolist()  # (with the tail's, `fix_units`)
        return units

    def _row_tokens(self, r: int, req, count: int) -> list[int]:
        """The `count` tokens row r (`req`) samples from unit 1 on: from `tokens` where the plan read
        them, else from the engine's read-ahead list of its stream (`Engine.stream_tokens`)."""
        if self.tokens is not None:
            return self.tokens[r][:count]
        start = self.outputs[r]
        end = start + count
        tokens = self.engine.stream_tokens[req.index]
        if tokens is None or len(tokens) < end:
            tokens = self._read_to(req, end)
        return tokens[start:end]

    def _read_to(self, req, end: int) -> list[int]:
        """`req`'s read-ahead token list (`Engine.stream_tokens`), read at least to output position `end`."""
        self.engine._read_ahead(req, end - 1)
        return self.engine.stream_tokens[req.index]

    def _append_tokens(self, units: int) -> None:
        """Append the tokens rows sample in units 1..`units` (one fewer for a row that skips unit 1)."""
        for r, (req, skip) in enumerate(zip(self.rows, self.skips or repeat(0))):
            req.output_token_ids.extend(self._row_tokens(r, req, units - skip))

    def _truncate_tokens(self) -> None:
        for req, start in zip(self.rows, self.outputs):
            del req.output_token_ids[start:]
