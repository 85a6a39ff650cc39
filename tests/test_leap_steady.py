"""`rows_at_rest` under async scheduling: the step in flight's rows are matched against the running
requests in the same pass, as a separate walk over that step would match them."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from policies.base import SchedulerOutput
from sim.core.request import RequestStatus
from sim.engine.leap_steady import length_stop, rows_at_rest, rows_near_stop

MAX_MODEL_LEN = 4096


class _Request(SimpleNamespace):
    """A request's fields that `rows_at_rest` reads, hashed by identity as a `Request` is."""

    __eq__, __hash__ = object.__eq__, object.__hash__


def _request(index: int, in_flight: bool, status=RequestStatus.RUNNING):
    """A decoding request at rest: one token in flight (a placeholder), or nothing in flight."""
    prompt, outputs = 10 + index, 3 + index
    return _Request(index=index, output_token_ids=[5] * outputs, num_prompt_tokens=prompt,
                    num_computed_tokens=prompt + outputs - (0 if in_flight else 1),
                    num_output_placeholders=int(in_flight), num_in_flight_extra=0, status=status,
                    num_spec_tokens=0, num_stale_tokens=0, quiet_until=40 - 3 * index)


def _matched_rows(rows: list, samples: list, running: list) -> dict | None:
    """The reference: a walk over the step in flight alone. Its rows, request -> tokens, if each of a
    request not finished samples and is running, in the order of `running`; else None."""
    found, i = {}, 0
    for (req, n), sample in zip(rows, samples):
        if req.status > RequestStatus.PREEMPTED:
            continue
        if not sample:
            return None
        while i < len(running) and running[i] is not req:
            i += 1
        if i == len(running):
            return None
        found[req] = n
        i += 1
    return found


@given(flags=st.lists(st.booleans(), min_size=1, max_size=6), finished=st.lists(st.integers(0, 6), max_size=3),
       swap=st.none() | st.integers(0, 5), mute=st.none() | st.integers(0, 5), stranger=st.none() | st.integers(0, 6))
def test_the_step_in_flight_is_matched_in_running_order(flags, finished, swap, mute, stranger):
    running = [_request(i, in_flight) for i, in_flight in enumerate(flags)]
    rows = [(req, 1) for req in running if req.num_output_placeholders]
    for at in finished:  # requests finished since the step was planned: passed over
        rows.insert(min(at, len(rows)), (_request(100 + at, True, RequestStatus.FINISHED_STOPPED), 1))
    if stranger is not None:  # a row of a request that is not running (waiting again)
        rows.insert(min(stranger, len(rows)), (_request(200, True, RequestStatus.PREEMPTED), 1))
    if swap is not None and swap + 1 < len(rows):
        rows[swap], rows[swap + 1] = rows[swap + 1], rows[swap]
    samples = [True] * len(rows)
    if mute is not None and mute < len(rows):
        samples[mute] = False
    step = SimpleNamespace(plan=SchedulerOutput(list(rows)), samples=samples)
    quick_stop = [(frozenset(), 1000)] * 300
    result = rows_at_rest(running, quick_stop, 1, MAX_MODEL_LEN, step, False)
    expected = _matched_rows(rows, samples, running)
    if expected is None:
        assert result is None or result is False
        return
    assert type(result) is tuple
    got_rows, outputs, computed, _, _, skips, decodes, quiet_units = result
    assert got_rows is running and computed == [req.num_computed_tokens for req in running]
    assert outputs == [len(req.output_token_ids) for req in running]
    assert (skips or [0] * len(running)) == [0 if req in expected else 1 for req in running]
    assert skips is None or 1 in skips
    assert decodes == len(expected)
    assert quiet_units == min(req.quiet_until - len(req.output_token_ids) + (req not in expected) for req in running)


def test_a_row_of_the_step_in_flight_that_does_not_sample_refuses_without_back_off():
    running = [_request(0, True), _request(1, True)]
    step = SimpleNamespace(plan=SchedulerOutput([(running[0], 1), (running[1], 1)]), samples=[True, False])
    assert rows_at_rest(running, [(frozenset(), 1000)] * 2, 1, MAX_MODEL_LEN, step, False) is None


@given(rows=st.lists(st.tuples(st.integers(3700, 4096), st.integers(0, 300), st.none() | st.integers(1, 400),
                               st.none() | st.integers(1, 400)), max_size=12),
       lag=st.integers(0, 1), skip_last=st.booleans(), within=st.integers(0, 64))
def test_the_rows_watched_are_those_within_reach_of_their_length_stop_nearest_first(rows, lag, skip_last, within):
    """`rows_near_stop` (its length rule spelled inline) picks what `length_stop` gives, row by row."""
    running, quick_stop = [], []
    for index, (prompt, outputs, max_tokens, limit) in enumerate(rows):
        running.append(_Request(index=index, num_prompt_tokens=prompt, output_token_ids=[7] * outputs,
                                sampling_params=SimpleNamespace(max_tokens=max_tokens)))
        quick_stop.append(None if limit is None else (frozenset({2}), limit))
    left = {req.index: length_stop(req, quick_stop[req.index], lag, MAX_MODEL_LEN, skip_last)
            - len(req.output_token_ids) for req in running if quick_stop[req.index] is not None}
    expected = sorted((n, i) for i, n in left.items() if n <= within)
    watched = rows_near_stop(running, quick_stop, lag, MAX_MODEL_LEN, skip_last, within)
    assert [req.index for req in watched] == [i for _, i in expected]
