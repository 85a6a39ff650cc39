"""Applying a quiet stretch: tokens, token times, counters, KV moves and step records in bulk, and the
SimPy delays that end exactly where the stretch does. Mixed into `StretchPlan` (sim.engine.leap_plan).
"""
from __future__ import annotations

import math
from itertools import repeat

from kernels_cost_model.batch import BatchShape
from policies.base import SchedulerOutput
from sim.engine.step import Step


class StretchApply:
    """Mixed into `StretchPlan`, which owns the stretch's numbers (`units`, `rows`, `times`, `planned`, ...)."""

    # ----- applying it ----------------------------------------------------------------------
    def apply(self) -> Step | None:
        """Do the stretch: KV events, tokens, token times, counters, step records. Returns the
        step in flight afterwards (async) or None."""
        units, rows = self.units, self.rows
        shared = self.engine.shared_times
        if shared is not None:  # (its slots time the rows' tokens: `_advance_rows` leaves their times)
            shared.stretch(rows, self.engine.requests.token_times, self.in_flight, self.times[1:units + 1],
                           self.skips)
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
        that skips unit 1) and their times (unless shared slots time them), count its computed
        tokens; under async scheduling, count the step now in flight's token (in flight, a
        placeholder) and a first token's time (the end of unit 1)."""
        units, times = self.units, self.times
        finish_times = times[1:]  # (the floats themselves: a running request's times are a list)
        requests = self.engine.requests
        token_times, first_token = requests.token_times, requests.first_token_time
        lag, timed = self.lag, self.engine.shared_times is None
        stream_tokens = self.engine.stream_tokens
        for req, row, o, skip in zip(self.rows, self.tokens or repeat(None), self.outputs, self.skips or repeat(0)):
            if row is None:  # (`_row_tokens` inline: the stream's tokens read ahead, from output o on)
                end = o + units - skip
                read = stream_tokens[req.index]
                if read is None or len(read) < end:
                    read = self._read_to(req, end)
                req.output_token_ids.extend(read[o:end])
            else:
                req.output_token_ids.extend(row[:units - skip])
            req.num_computed_tokens += units
            if timed:
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
        slot = None
        if len(rows) < self.num_rows:
            duration = self.engine.cost_model.step_time(batch)
        elif self.engine.shared_times is not None:  # (every running request: a slot times its rows)
            slot = self.engine.shared_times.take()
        start = self.now if unit == 1 else self.times[unit - 1]
        return Step(SchedulerOutput([(req, 1) for req in rows]), batch, duration, start, 0, [True] * len(rows),
                    time_slot=slot)

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


def exact_delays(now: float, times: list, finishing: list, units: int) -> list[float]:
    """Delays whose SimPy timeouts end exactly at times[units]: one if a single delay lands there
    bit for bit, else one per step (each added as the step-by-step loop adds it)."""
    end = times[units]
    delay = end - now
    for _ in range(4):
        if now + delay == end:
            return [delay]
        delay = math.nextafter(delay, math.inf if now + delay < end else -math.inf)
    return finishing[:units]
