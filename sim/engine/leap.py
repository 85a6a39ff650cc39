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
"""
from __future__ import annotations

import math
from itertools import islice

import numpy as np

from kernels_cost_model.batch import BatchShape
from policies.base import SchedulerOutput
from policies.vllm import VllmV1Policy
from policies.vllm_v0 import VllmV0Policy
from sim.core.kv_cache import KVCacheManager
from sim.core.request import RequestStatus
from sim.engine.decode_times import decode_step_times
from sim.engine.engine import Engine, Step

#: Policies whose pure-decode step is "each running request, in order, one token" and whether they
#: try the waiting head with the whole budget (V0: prefills first) or with what decodes leave (V1).
ADMISSION_FIRST = {VllmV1Policy: False, VllmV0Policy: True}
MAX_UNITS = 4096   # at most this many steps per leap (bounds the arrays of one leap)
MIN_UNITS = 2      # a shorter stretch is left to single steps
SPAN_FROM = 48     # read more tokens than this per row with the stream's vectorised span
MAX_COOLDOWN = 16  # loop turns between leap attempts after many misses


def make_leaper(engine: Engine) -> "Leaper | None":
    """A Leaper for `engine`, or None where leaping is not supported (hooks, custom KV managers,
    policies other than vLLM V1's and V0's, invariant checks after every step)."""
    if (engine.hooks or type(engine.state.kv) is not KVCacheManager or engine.config.check_invariants
            or type(engine.policy) not in ADMISSION_FIRST or engine.state.kv.num_lookahead_tokens):
        return None
    return Leaper(engine)


class Leaper:
    """Finds and applies quiet stretches for one engine."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.lag = 1 if engine.config.is_async else 0  # steps planned ahead of the one finishing
        self.steps_leapt = 0                            # steps done by leaps so far
        self.misses = 0                                 # leap attempts failed in a row
        self.cooldown = 0                               # loop turns to let pass before the next try

    def leap(self, in_flight: Step | None, now: float, horizon: float):
        """From the loop's point "step k finished at `now`" (`in_flight`: step k+1 under async),
        apply a quiet stretch of U >= MIN_UNITS steps if there is one before `horizon` (the next
        event due in SimPy). Returns (the step now in flight, delays to wait) or None."""
        if self.cooldown:
            self.cooldown -= 1
            return None
        rows = self._steady_rows(in_flight, now, horizon)
        plan = None if rows is None else _StretchPlan(self, rows, in_flight, now)
        if plan is None or not plan.fix_units(horizon):
            # back off after misses (under overload stretches are rare): whether the engine looks
            # for a leap never changes its results, only how fast it gets them
            self.misses += 1
            self.cooldown = min(self.misses, MAX_COOLDOWN)
            return None
        self.misses = 0
        delays = _exact_delays(now, plan.times, plan.finishing, plan.units)
        self.steps_leapt += plan.units
        return plan.apply(), delays

    # ----- is the engine at a steady point? ------------------------------------------------
    def _steady_rows(self, in_flight: Step | None, now: float, horizon: float):
        engine, lag = self.engine, self.lag
        state = engine.state
        running = state.running
        if (not running or engine.pending_aborts or engine.steps_in_flight != lag
                or (in_flight is None) != (lag == 0)
                or len(running) > state.config.max_num_batched_tokens):
            return None
        if in_flight is not None and (not _decodes_of(in_flight, running)
                                      or now + in_flight.duration >= horizon):
            return None  # (the step in flight itself would end at or after the next event)
        quick_stop = engine.quick_stop
        running_status = RequestStatus.RUNNING
        for req in running:
            quick = quick_stop[req.index]
            if (req.status != running_status or req.num_spec_tokens or req.num_stale_tokens
                    or req.num_in_flight_tokens != lag or req.num_output_placeholders != lag
                    or not req.output_token_ids or quick is None
                    or quick[1] - len(req.output_token_ids) - 1 < MIN_UNITS  # a length rule is near
                    or req.num_computed_tokens != req.num_prompt_tokens + len(req.output_token_ids) - 1 + lag):
                return None
        return running


def _decodes_of(step: Step, running: list) -> bool:
    """`step` decodes every running request, in order, and besides them has only rows of requests
    that finished since it was planned (async scheduling's wasted last step: they are skipped)."""
    if step.plan.preempted:
        return False
    finished = RequestStatus.PREEMPTED
    i, count = 0, len(running)
    for (req, n), samples in zip(step.plan.scheduled, step.samples):
        if req.status > finished:
            continue
        if i == count or req is not running[i] or n != 1 or not samples:
            return False
        i += 1
    return i == count


class _StretchPlan:
    """The numbers of one candidate stretch: units u = 1..U, each "plan step k+lag+u, then finish
    step k+u" (a sync engine plans the step it then finishes)."""

    def __init__(self, leaper: Leaper, rows: list, in_flight: Step | None, now: float):
        engine = leaper.engine
        self.engine, self.lag, self.rows, self.in_flight, self.now = engine, leaper.lag, rows, in_flight, now
        self.kv = engine.state.kv
        self.num_rows = len(rows)
        self.outputs = np.array([len(r.output_token_ids) for r in rows], dtype=np.int64)
        self.prompts = np.array([r.num_prompt_tokens for r in rows], dtype=np.int64)
        self.computed = self.prompts + self.outputs - 1 + self.lag
        self.units = 0
        self.tokens: list[list[int]] = []

    # ----- how many units are quiet -------------------------------------------------------
    def fix_units(self, horizon: float) -> bool:
        units = self._static_limit()
        if units < MIN_UNITS:
            return False
        units = self._time_limit(units, horizon)
        if units < MIN_UNITS:
            return False
        units = self._token_limit(units)
        if units < MIN_UNITS:
            return False
        units = self._kv_limit(units)
        if units < MIN_UNITS:
            return False
        self.units = units
        self.times = self.times[:units + 1]
        return True

    def _static_limit(self) -> int:
        """Units before a length rule, the async last-token skip or max_model_len stop a row."""
        engine = self.engine
        max_model_len = engine.config.max_model_len
        limits = np.array([engine.quick_stop[r.index][1] for r in self.rows], dtype=np.int64)
        units = int((limits - self.outputs - 1).min())
        units = min(units, int((max_model_len - 1 - self.computed).min()), MAX_UNITS)
        if self.lag:
            max_tokens = np.array([r.sampling_params.max_tokens or max_model_len - r.num_prompt_tokens
                                   for r in self.rows], dtype=np.int64)
            units = min(units, int((self.prompts + max_tokens - self.computed - 1).min()))
        return units

    def _time_limit(self, units: int, horizon: float) -> int:
        """Units whose finish comes strictly before `horizon`. Fills `self.planned` (durations of
        the steps planned at units 1..), `self.finishing` (of the steps finishing at units 1..) and
        `self.times` (t_k, t_k+1, ...: the finish times, summed in order as SimPy adds them)."""
        cost_model, computed = self.engine.cost_model, self.computed
        planned = decode_step_times(cost_model, computed, 0, 1)
        first = planned[0] if not self.lag else min(planned[0], self.in_flight.duration)
        # durations grow with the context: the first one bounds how many fit before the horizon
        chunk = units if first <= 0 else int(min(units, (horizon - self.now) / first + 2))
        while True:
            count = min(chunk, units - len(planned))
            planned = np.concatenate((planned, decode_step_times(cost_model, computed, len(planned), count)))
            finishing = planned if not self.lag else np.concatenate(([self.in_flight.duration], planned[:-1]))
            times = np.cumsum(np.concatenate(([self.now], finishing)))  # sequential, as SimPy adds
            if len(planned) >= units or times[-1] >= horizon:
                break
            chunk = max(16, 2 * chunk)
        self.planned, self.finishing, self.times = planned, finishing, times
        return min(units, int(np.searchsorted(times, horizon, side="left")) - 1)

    def _token_limit(self, units: int) -> int:
        """Units before any row's next token could stop it; keeps the tokens of those units."""
        engine = self.engine
        tokens = []
        for req, start in zip(self.rows, self.outputs.tolist()):
            stream = engine.streams[req.index]
            stop_ids = engine.quick_stop[req.index][0]
            span = getattr(stream, "span", None) if units > SPAN_FROM else None
            if span is not None:
                span_tokens = span(start, start + units)
                hits = np.flatnonzero(np.isin(span_tokens, tuple(stop_ids))) if stop_ids else ()
                if len(hits):
                    units = int(hits[0])
                row = span_tokens.tolist()
            else:
                row = [stream(p) for p in range(start, start + units)]
                for i, token in enumerate(row):
                    if token in stop_ids:
                        units = i
                        break
            tokens.append(row)
            if units < MIN_UNITS:
                return units
        self.tokens = tokens
        return units

    def _kv_limit(self, units: int) -> int:
        """Units whose block allocations all fit and cannot let the waiting head in. Builds the
        ordered KV events: (unit, row, pops a block, registers full blocks up to a token count)."""
        kv, bs = self.kv, self.kv.block_size
        held = np.array([len(kv.req_blocks.get(r, ())) for r in self.rows], dtype=np.int64)
        first_pop = held * bs + 1 - self.computed   # unit of the first block crossing
        if (first_pop < 1).any():
            return 0
        pop_units, pop_rows = _periodic(first_pop, bs, units)
        reg_units, reg_rows = self._registrations(units)
        # events sorted by (unit, row); a pop comes before its row's registration in one allocate
        units_all = np.concatenate((pop_units, reg_units))
        rows_all = np.concatenate((pop_rows, reg_rows))
        kinds = np.concatenate((np.zeros(len(pop_units), np.int64), np.ones(len(reg_units), np.int64)))
        order = np.lexsort((kinds, rows_all, units_all))
        units_all, rows_all, kinds = units_all[order], rows_all[order], kinds[order]
        free = len(kv.free_queue)
        pops = np.flatnonzero(kinds == 0)
        if len(pops) > free:
            units = min(units, int(units_all[pops[free]]) - 1)
        units = min(units, self._admission_limit(units_all, rows_all, kinds, pops[:free], units))
        keep = units_all <= units
        self.events = (units_all[keep].tolist(), rows_all[keep].tolist(), kinds[keep].tolist())
        return units

    def _registrations(self, units: int):
        """(unit, row) of every allocate that registers new full blocks: the target is
        prompt + output - 1 + u tokens at unit u."""
        if not self.kv.enable_prefix_caching:
            empty = np.zeros(0, np.int64)
            return empty, empty
        bs = self.kv.block_size
        hashed = np.array([self.kv.num_hashed_blocks.get(r, 0) for r in self.rows], dtype=np.int64)
        base = self.prompts + self.outputs - 1          # target at unit u is base + u
        first_target_blocks = (base + 1) // bs
        at_one = first_target_blocks > hashed
        # later registrations: units where base + u is a multiple of bs (u >= 2)
        first_multiple = (-(base + 2)) % bs + 2
        u_multi, r_multi = _periodic(first_multiple, bs, units)
        rows_one = np.flatnonzero(at_one)
        return (np.concatenate((np.ones(len(rows_one), np.int64), u_multi)),
                np.concatenate((rows_one, r_multi)))

    def _admission_limit(self, units_all, rows_all, kinds, pops, units: int) -> int:
        """Units during which the waiting head stays out. The policy tries it after the running
        pass when a seat and budget are left; with `scheduler_reserve_full_isl` it needs blocks for
        its whole sequence. Those only grow scarcer unless a block of its prefix chain is registered
        or evicted (the cache hits it would get change): the stretch ends before that."""
        state = self.engine.state
        config = state.config
        budget = config.max_num_batched_tokens
        if not ADMISSION_FIRST[type(self.engine.policy)]:
            budget -= self.num_rows
        if not state.waiting or len(state.running) >= config.max_num_seqs or budget <= 0:
            return units
        head = state.waiting[0]
        if not config.scheduler_reserve_full_isl:
            return 0
        kv = self.kv
        cached_blocks, num_cached = kv.lookup_prefix(head)
        if kv.can_fit(head, head.num_tokens - num_cached, cached_blocks):
            return 0
        if not kv.enable_prefix_caching:
            return units
        max_blocks = (head.num_tokens - 1) // kv.block_size
        chain = set(kv.req_hashes.get(head, ())[:max_blocks])
        if not chain:
            return units
        block_hash = kv.block_hash
        for i, block in enumerate(islice(kv.free_queue, len(pops))):
            if block_hash[block] in chain:
                units = min(units, int(units_all[pops[i]]) - 1)
                break
        self._append_tokens(units)   # the hashes below read the tokens
        targets = self.prompts + self.outputs - 1
        for u, r, kind in zip(units_all.tolist(), rows_all.tolist(), kinds.tolist()):
            if u > units:
                break
            if kind == 1:
                req = self.rows[r]
                num_full = int(targets[r] + u) // kv.block_size
                if any(h in chain for h in kv._hashes(req, num_full)[kv.num_hashed_blocks.get(req, 0):num_full]):
                    units = u - 1
                    break
        self._truncate_tokens()
        return units

    def _append_tokens(self, units: int) -> None:
        for req, row in zip(self.rows, self.tokens):
            req.output_token_ids.extend(row[:units])

    def _truncate_tokens(self) -> None:
        for req, start in zip(self.rows, self.outputs.tolist()):
            del req.output_token_ids[start:]

    # ----- applying it ----------------------------------------------------------------------
    def apply(self) -> Step | None:
        """Do the stretch: KV events, tokens, token times, counters, step records. Returns the
        step in flight afterwards (async) or None."""
        units, rows = self.units, self.rows
        snapshots = self._replay_kv()
        self._append_tokens(units)
        times = self.times
        finish_times = times[1:].tolist()
        token_times = self.engine.requests.token_times
        for req in rows:
            req.num_computed_tokens += units
            column = token_times[req.index]
            if column is not None:
                column.extend(finish_times)
        self._record_steps(snapshots)
        if not self.lag:
            return None
        context = (self.computed + units - 1).tolist()
        scheduled = [(req, 1) for req in rows]
        batch = BatchShape([1] * self.num_rows, context, self.num_rows)
        start = self.now if units == 1 else float(times[units - 1])
        return Step(SchedulerOutput(scheduled), batch, float(self.planned[units - 1]), start, 0,
                    [True] * self.num_rows)

    def _replay_kv(self):
        """Make the stretch's block allocations and registrations in order; the KV counters after
        each unit (used, cached, free) as arrays."""
        kv, units = self.kv, self.units
        used = np.empty(units + 1, np.int64)
        cached = np.empty(units + 1, np.int64)
        seen = np.zeros(units + 1, bool)
        seen[0] = True
        used[0], cached[0] = kv.num_used_blocks, len(kv.cached)
        unit_list, row_list, kind_list = self.events
        if kind_list:
            self._append_tokens(units)
            if kv.enable_prefix_caching:  # hash each row's new full blocks in one go (memoised)
                for req, target in zip(self.rows, (self.prompts + self.outputs - 1 + units).tolist()):
                    kv._hashes(req, target // kv.block_size)
            targets = (self.prompts + self.outputs - 1).tolist()
            rows, req_blocks, total = self.rows, kv.req_blocks, kv.num_gpu_blocks - 1
            free_queue, kv_cached = kv.free_queue, kv.cached
            for u, r, kind in zip(unit_list, row_list, kind_list):
                req = rows[r]
                if kind == 0:
                    req_blocks[req].append(kv._pop_free())
                else:
                    kv.cache_full_blocks(req, targets[r] + u)
                used[u] = total - len(free_queue)
                cached[u] = len(kv_cached)
                seen[u] = True
            self._truncate_tokens()
        index = np.maximum.accumulate(np.where(seen, np.arange(units + 1), 0))
        used, cached = used[index][1:], cached[index][1:]
        return used, cached, (kv.num_gpu_blocks - 1) - used

    def _record_steps(self, snapshots) -> None:
        """Append the records of the U steps that finished (steps k+1 .. k+U)."""
        units, lag, times = self.units, self.lag, self.times
        steps = self.engine.steps
        starts = [self.now] + times[1:units].tolist()   # `now` kept as it is (SimPy starts at int 0)
        if lag:
            starts = [self.in_flight.start] + starts[:-1]
        finishing = self.finishing[:units]
        b = self.num_rows
        used, cached, free = snapshots
        prefill, batch, sampled = [0] * units, [b] * units, [b] * units
        if lag:  # the step in flight may still carry rows of requests finished since
            first = self.in_flight
            prefill[0] = sum(first.batch.num_new_tokens) - b
            batch[0] = len(first.plan.scheduled)
            sampled[0] = first.batch.num_sampled
        steps.start_time.extend(starts)
        steps.duration.extend(finishing.tolist())
        steps.num_prefill_tokens.extend(prefill)
        steps.num_decode_tokens.extend([b] * units)
        steps.batch_size.extend(batch)
        steps.num_sampled.extend(sampled)
        steps.num_preempted.extend([0] * units)
        steps.kv_blocks_used.extend(used.tolist())
        steps.kv_blocks_cached.extend(cached.tolist())
        steps.kv_blocks_free.extend(free.tolist())
        steps.num_running.extend([b] * units)
        steps.num_waiting.extend([len(self.engine.state.waiting)] * units)


def _periodic(first: np.ndarray, period: int, last: int):
    """(unit, row) pairs for units first[r], first[r] + period, ... up to `last`, over rows r."""
    counts = np.where(first <= last, (last - first) // period + 1, 0)
    total = int(counts.sum())
    if not total:
        empty = np.zeros(0, np.int64)
        return empty, empty
    rows = np.repeat(np.arange(len(first)), counts)
    starts = np.cumsum(counts) - counts
    within = np.arange(total) - np.repeat(starts, counts)
    return first[rows] + within * period, rows


def _exact_delays(now: float, times: np.ndarray, finishing: np.ndarray, units: int) -> list[float]:
    """Delays whose SimPy timeouts end exactly at times[units]: one if a single delay lands there
    bit for bit, else one per step (each added as the step-by-step loop adds it)."""
    end = float(times[units])
    delay = end - now
    for _ in range(4):
        if now + delay == end:
            return [delay]
        delay = math.nextafter(delay, math.inf if now + delay < end else -math.inf)
    return finishing[:units].tolist()
