"""Where a leap may start: the engine's state at rest, and the horizon no event comes before.

`rows_at_rest` reads the running requests and the step in flight (under async scheduling) in one
pass; `quiet_horizon` reads SimPy's queue. Used by `sim.engine.leap`.
"""
from __future__ import annotations

import math
from heapq import heappop, heappush

from simpy.events import Timeout

from sim.core.request import RequestStatus
from sim.engine.engine import Step

MAX_UNITS = 4096   # at most this many steps per leap (bounds the arrays of one leap)
MIN_UNITS = 1      # a shorter stretch is left to single steps
ROWS_PER_UNIT = 24  # ... and, for big batches, one shorter than a unit per so many rows (`least_units`)
QUIET_SCAN = 32    # events that do nothing looked past for the horizon, at most


def quiet_horizon(env) -> float:
    """The time of the next event in `env`'s queue that can change anything: one with callbacks (a
    process waits on it) or one that failed (it would stop the run). An event that succeeded and
    that nothing waits on (a finished request's `done` event in an open-loop run) does nothing when
    SimPy processes it, and nothing can start waiting on it before an event that does something
    runs, so a leap may pass it (SimPy still processes it, in order, during the leap's timeouts).
    The heap is walked in time order from its root, over at most QUIET_SCAN events that do nothing
    (an earlier horizon than the true one only shortens leaps)."""
    queue = env._queue
    if not queue:
        return math.inf
    first = queue[0]
    event = first[3]
    if event.callbacks or not event._ok:
        return first[0]
    for when, event in _in_time_order(queue):  # (the root does nothing: walk on, as events_due does)
        if event is None or event.callbacks or not event._ok:
            return when
    return math.inf


def events_due(env, end: float) -> list | None:
    """The events in `env`'s queue due at or before `end` that do something (as `quiet_horizon`
    counts them), (time, event) in time order, at most two; None where the walk gives up first."""
    due = []
    for when, event in _in_time_order(env._queue):
        if when > end:
            break
        if event is None:
            return None
        if event.callbacks or not event._ok:
            due.append((when, event))
            if len(due) == 2:
                break
    return due


def _in_time_order(queue: list):
    """(time, event) of `queue` (SimPy's heap) in time order, walked from its root over at most
    QUIET_SCAN events; then (time of the next, None) if any is left."""
    if not queue:
        return
    frontier = [(queue[0], 0)]
    size = len(queue)
    for _ in range(QUIET_SCAN + 1):
        if not frontier:
            return
        entry, i = heappop(frontier)
        yield entry[0], entry[3]
        for child in (2 * i + 1, 2 * i + 2):
            if child < size:
                heappush(frontier, (queue[child], child))
    if frontier:
        yield frontier[0][0][0], None


class ArrivalTimeout(Timeout):
    """The timeout an open-loop arrival process waits on before it hands `spec` to `submit`; it
    knows when the arrival after it is due (`next_arrival`, inf for none), so a leap can tell an
    arrival that only queues a request from any other event (`Leaper.arrival_lands_in`)."""

    def __init__(self, env, delay: float, spec, submit, next_arrival: float):
        super().__init__(env, delay)
        self.spec, self.submit, self.next_arrival = spec, submit, next_arrival


def least_units(num_rows: int) -> int:
    """The shortest stretch worth a leap for a batch of `num_rows`: a leap's fixed cost (a few passes
    over the rows) is a few steps' worth for big batches (vLLM V0 at 128 rows: ~4), and a stretch
    that short there is a loss. Only speed depends on it, never the records."""
    return max(MIN_UNITS, num_rows // ROWS_PER_UNIT)


def rows_at_rest(running: list, quick_stop: list, lag: int, max_model_len: int, in_flight: Step | None,
                 skip_last: bool, min_units: int = MIN_UNITS):
    """(rows, their output counts, their computed tokens (each row's context at the stretch's first
    unit), units before a length rule, the async last-token skip or max_model_len stops one, which
    rows skip the first unit, the step in flight's decode rows, units before a row samples a token its
    stop test must see by `Request.quiet_until` (<= 0 where a row's is not known or lies behind it))
    if every running request decodes from
    the next step on and its next tokens can only stop it by a known token or such a rule, none
    within `min_units` of one. Else the row whose length rule is near (`near_length_stop` holds for it
    until it leaves the batch or the batch shrinks: a cheap refusal until then), False where another
    row refuses, None where the step in flight does. One pass.

    Under async scheduling (`in_flight`: the step in flight) its rows must be running requests, in
    the order of `running`, that sample at its end (unit 1): a decode, or a prompt's last chunk (then
    it may have no output yet); rows of requests finished since it was planned (async scheduling's
    wasted last step) are passed over. A running row not in it (vLLM V0 runs a step of prefills
    alone) has nothing in flight and samples from unit 2 on ("skips" unit 1)."""
    running_status, finished = RequestStatus.RUNNING, RequestStatus.PREEMPTED
    outputs, contexts = [], []
    skips = None   # (a list once a row skips unit 1)
    least = MAX_UNITS + 1  # min over rows of (output count at which a rule binds) - outputs
    plan_least = MAX_UNITS + 1  # the same for the rules that leave a row out of a plan
    quiet_least = MAX_UNITS + 1  # min over rows of quiet_until - outputs (+ 1 for a row that skips unit 1)
    skip_last = lag and skip_last
    edge = max_model_len - lag + 1  # less its prompt: the output count where max_model_len leaves a row out
    decodes = 0            # rows of the step in flight that are decodes (its record counts them)
    skip = 0
    if lag:
        if in_flight.plan.preempted:
            return None
        flying, samples = in_flight.plan.scheduled, in_flight.samples
        f, num_flying = 0, len(flying)  # the step in flight's next row
    for req in running:
        quick = quick_stop[req.index]
        o = len(req.output_token_ids)
        prompt = req.num_prompt_tokens
        computed = req.num_computed_tokens
        if lag:
            while f < num_flying and flying[f][0].status > finished:
                f += 1
            if f < num_flying and flying[f][0] is req:  # samples at the end of the step in flight
                if not samples[f]:
                    return None
                n = flying[f][1]
                f += 1
                if (req.num_output_placeholders != 1 or req.num_in_flight_extra != n - 1
                        or computed != prompt + o):
                    return False
                if n == 1 and o:
                    decodes += 1
                skip = 0
            else:  # not in the step in flight: a decode with nothing in flight
                if (req.num_in_flight_extra or req.num_output_placeholders or not o
                        or computed != prompt + o - 1):
                    return False
                if skips is None:
                    skips = [0] * len(outputs)
                skip = 1
            if skips is not None:
                skips.append(skip)
        elif (req.num_in_flight_extra or req.num_output_placeholders or not o
              or computed != prompt + o - 1):
            return False
        if req.status is not running_status or req.num_spec_tokens or req.num_stale_tokens or quick is None:
            return False
        # the count of outputs at which the row must stop: its length rule; or be left out of a
        # plan: max_model_len (its computed tokens reach max_model_len - 1), or under async with
        # vLLM V1's policy its last token in flight (bounds for a row that samples at unit 1: one
        # that skips it stops a unit later at most)
        # (`length_stop` states the same rule for one row; inlined here: this pass runs per attempt)
        plan_stop = edge - prompt
        if skip_last:
            cap = req.sampling_params.max_tokens or max_model_len - prompt
            if cap < plan_stop:
                plan_stop = cap
        if plan_stop - o < plan_least:
            plan_least = plan_stop - o
        limit = quick[1]
        stop = limit if limit < plan_stop else plan_stop
        if stop - o < least + 1:
            if stop - o - 1 < min_units:
                return req  # a length rule is near
            # (a row that skips unit 1 reaches its count a unit later; where the plan rule binds,
            # `plan_least` keeps the stretch short of it)
            bound = stop - o + 1 if skip and limit < plan_stop else stop - o
            if bound < least:
                least = bound
        quiet = req.quiet_until - o + skip
        if quiet < quiet_least:
            quiet_least = quiet
        outputs.append(o)
        contexts.append(computed)
    if lag:
        for req, _ in flying[f:]:
            if req.status <= finished:
                return None  # a row of the step in flight not running, or out of running's order
    return running, outputs, contexts, least - 1, plan_least - 1, skips, decodes, quiet_least


def length_stop(req, quick: tuple, lag: int, max_model_len: int, skip_last: bool) -> int:
    """The output count at which a length rule stops `req` or leaves it out of a plan (as in
    `rows_at_rest`)."""
    plan = plan_stop(req, lag, max_model_len, skip_last)
    return quick[1] if quick[1] < plan else plan


def plan_stop(req, lag: int, max_model_len: int, skip_last: bool) -> int:
    """The output count from which a plan leaves `req` out: its computed tokens reach
    max_model_len - 1, or (async, vLLM V1: `skip_last`) its step in flight samples its last token
    (as in `rows_at_rest`)."""
    prompt = req.num_prompt_tokens
    stop = max_model_len - prompt - lag + 1
    if lag and skip_last:
        cap = req.sampling_params.max_tokens or max_model_len - prompt
        if cap < stop:
            stop = cap
    return stop


def near_length_stop(req, quick_stop: list, lag: int, max_model_len: int, skip_last: bool,
                     min_units: int = MIN_UNITS) -> bool:
    """Whether `req` (running) is within `min_units` of the output count where a length rule stops it
    or leaves it out of a plan: `rows_at_rest` then refuses (the same test for one row; its output
    count only grows while it runs, so this stays true until it leaves the batch, or until the batch
    shrinks where `min_units` is `least_units` of its size)."""
    quick = quick_stop[req.index]
    if quick is None:
        return False
    return length_stop(req, quick, lag, max_model_len, skip_last) - len(req.output_token_ids) - 1 < min_units


def rows_near_stop(running: list, quick_stop: list, lag: int, max_model_len: int, skip_last: bool,
                   within: int) -> list:
    """The running rows within `within` outputs of their length stop, nearest first: the rows to
    watch for `near_length_stop` after a refusal (one pass, instead of one per row that stops)."""
    near = []
    edge = max_model_len - lag + 1  # (`length_stop` inline: a call per row cost more than the rest of it)
    skip_last = lag and skip_last
    for req in running:
        quick = quick_stop[req.index]
        if quick is None:
            continue
        prompt = req.num_prompt_tokens
        stop = edge - prompt
        if skip_last:
            cap = req.sampling_params.max_tokens or max_model_len - prompt
            if cap < stop:
                stop = cap
        if quick[1] < stop:
            stop = quick[1]
        left = stop - len(req.output_token_ids)
        if left <= within:
            near.append((left, len(near), req))
    near.sort()
    return [req for _, _, req in near]


def watch_refuses(watch: list, quick_stop: list, lag: int, max_model_len: int, skip_last: bool,
                  min_units: int) -> bool:
    """Whether a row of `watch` (from `rows_near_stop`) runs and is near its length rule: then the
    pass over the rows would refuse again (a few rows' checks instead). Drops the rows at its front
    that left the batch."""
    running = RequestStatus.RUNNING
    while watch and watch[0].status is not running:
        del watch[0]
    return any(req.status is running and near_length_stop(req, quick_stop, lag, max_model_len, skip_last,
                                                          min_units) for req in watch)
