"""Token times kept as runs (`record_token_times = "runs"`) read back as the same floats, bit for bit,
in both engine modes; the store holds a few integers per finished request."""
from __future__ import annotations

from array import array
from dataclasses import replace

import pytest
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kernels_cost_model.errors import ConfigError
from sim.api.results import Results
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.token_runs import TokenRuns, TokenTimes
from sim.engine.simulation import run_engine
from tests.test_fast_mode import configs, long_runs
from workloads import poisson_workload


def _times(records) -> list:
    return [None if t is None else list(t) for t in records.requests.times()]


@settings(max_examples=40)
@given(long_runs(), configs())
def test_runs_read_back_the_arrays_times_in_both_modes(specs, config):
    for mode in ("step", "fast"):
        plain = run_engine(specs, replace(config, mode=mode), LinearCostModel())
        runs = run_engine(specs, replace(config, mode=mode, record_token_times="runs"), LinearCostModel())
        assert repr(_times(runs)) == repr(_times(plain))
        assert repr({k: list(v) for k, v in runs.requests.columns().items()}) == \
            repr({k: list(v) for k, v in plain.requests.columns().items()})


@pytest.mark.parametrize("mode", ["step", "fast"])
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_sharegpt_run_keeps_a_few_runs_per_request(mode, async_scheduling):
    """Preemptions included (small KV): every finished request is compacted, to a few runs each."""
    config = EngineConfig(num_gpu_blocks=1_500, max_model_len=16384, max_num_batched_tokens=8192,
                          async_scheduling=async_scheduling, mode=mode)
    workload = poisson_workload(rate=30.0, num_requests=60, lengths="sharegpt")
    plain = run_engine(workload, config, LinearCostModel())
    runs = run_engine(workload, replace(config, record_token_times="runs"), LinearCostModel())
    assert repr(_times(runs)) == repr(_times(plain))
    store = runs.requests.token_runs
    assert all(t is None for t in runs.requests.token_times)  # nothing left as arrays
    counts = [len(store.runs(i)) for i in range(len(store.offsets))]
    assert max(counts) <= 2 + 2 * max(runs.requests.num_preemptions)
    assert sum(map(len, store.others.values())) <= len(counts)
    tokens = sum(runs.requests.num_output_tokens)
    assert store.nbytes() < 8 * tokens / 4
    results = Results.from_records(runs)
    assert results.summary == Results.from_records(plain).summary


class _Steps:
    def __init__(self, starts):
        self.start_time = array("d", starts)


def test_times_no_step_started_at_are_kept_as_they_are():
    store = TokenRuns(_Steps([0.0, 1.0, 2.0, 2.0, 3.0, 5.0]))
    live = [array("d", [1.0, 1.5, 2.0, 3.0, 4.0, 4.0]), array("d"), None]
    for _ in live:
        store.add_request()
    for index in range(3):
        store.finish(index, live)
    store.compact(live)
    assert live == [None, None, None]
    assert list(store.times(0)) == [1.0, 1.5, 2.0, 3.0, 4.0, 4.0]
    assert list(store.times(1)) == [] and store.times(2) is None
    assert list(store.others[0]) == [1.5, 4.0, 4.0] and list(store.others) == [0]


def test_a_request_waits_for_the_step_that_starts_at_its_last_token():
    steps = _Steps([0.0, 1.0])
    store, live = TokenRuns(steps), [array("d", [1.0, 2.0])]
    store.add_request()
    store.finish(0, live)
    store.compact(live, final=False)
    assert live[0] is not None and store.times(0) is None  # 2.0 may still start a step
    steps.start_time.append(2.0)
    store.compact(live, final=False)
    assert live[0] is None and list(store.times(0)) == [1.0, 2.0] and not store.others


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_record_token_times_must_be_true_false_or_runs(value):
    with pytest.raises(ConfigError, match="record_token_times"):
        EngineConfig(record_token_times=value)


def compacted(starts: list, requests: list) -> tuple:
    """(a TokenRuns over steps starting at `starts` with every request of `requests` finished and
    compacted, the live token-time slots it emptied)."""
    store = TokenRuns(_Steps(starts))
    live = [array("d", t) for t in requests]
    for index in range(len(live)):
        store.add_request()
        store.finish(index, live)
    store.compact(live)
    return store, live


@st.composite
def _timelines(draw):
    """Step start times (non-decreasing, a repeat now and then) and requests' token times: runs of
    positions with skips and lengths of any size, and for some requests times several tokens share
    or that no step started at."""
    pattern = draw(st.lists(st.sampled_from([0.25, 0.5, 1.0, 3.0]), min_size=1, max_size=6))
    starts = np.cumsum([0.0, *np.resize(pattern, draw(st.integers(0, 1500)))]).tolist()
    if draw(st.booleans()):
        repeat = draw(st.integers(0, len(starts) - 1))
        starts.insert(repeat, starts[repeat])
    requests = []
    for _ in range(draw(st.integers(1, 4))):
        position, times = draw(st.integers(0, 300)), []
        for skip, length in draw(st.lists(st.tuples(st.integers(1, 600), st.integers(1, 600)), min_size=1, max_size=4)):
            times += starts[position:position + length]
            position += length + skip
        if draw(st.booleans()):
            times += draw(st.lists(st.sampled_from(starts) | st.floats(-1.0, 5e3, allow_nan=False), max_size=4))
        requests.append(sorted(times))
    return starts, requests


@settings(max_examples=60)
@given(_timelines())
@example(([0.0], [[-0.0]]))  # -0.0 equals 0.0, but its bits do not: kept apart, read back as itself
def test_runs_round_trip_to_the_same_floats(timeline):
    """Any times, compacted, read back equal (bit for bit) to the plain lists; runs longer than a
    pair's byte or far apart take several pairs; times off the steps are kept as they are."""
    starts, requests = timeline
    store, live = compacted(starts, requests)
    assert live == [None] * len(requests)
    for index, times in enumerate(requests):
        back = store.times(index)
        assert back.tobytes() == array("d", times).tobytes()
        assert all(length > 0 for _, length in store.runs(index))
    assert TokenTimes([None] * len(requests), store) == [array("d", t) for t in requests]


@settings(max_examples=40)
@given(_timelines())
def test_requests_compacted_together_are_stored_as_one_at_a_time(timeline):
    """The store's one numpy pass over several requests keeps each request's runs apart: the same
    pairs, positions and stray times as compacting them one by one."""
    starts, requests = timeline
    together, _ = compacted(starts, requests)
    alone, live = TokenRuns(_Steps(starts)), [array("d", t) for t in requests]
    for index in range(len(live)):
        alone.add_request()
        alone.finish(index, live)
        alone.compact(live)
    for name in ("pairs", "offsets", "firsts", "counts"):
        assert getattr(together, name) == getattr(alone, name), name
    assert together.others == alone.others


@settings(max_examples=40)
@given(_timelines(), st.floats(-2.0, 50.0), st.data())
def test_tokens_per_second_from_runs_count_every_time(timeline, start, data):
    """Counted per step position from the runs (and from the times of requests with times off the
    steps), the tokens per second equal a count over every time of the chosen requests."""
    from sim.api.itl import tokens_per_second
    starts, requests = timeline
    store, live = compacted(starts, requests)
    chosen = np.array(sorted(data.draw(st.sets(st.integers(0, len(requests) - 1)))), dtype=np.int64)
    times = [t for i in chosen.tolist() for t in requests[i]]
    dense = np.bincount(np.floor(np.array(times) - start).astype(int).clip(min=0)) if times else np.zeros(0)
    expected = (np.flatnonzero(dense).tolist(), dense[dense > 0].tolist())
    chunk = data.draw(st.integers(1, 4))
    for token_times in (TokenTimes(live, store), [array("d", t) for t in requests]):
        seconds, counts = tokens_per_second(token_times, chosen, start, chunk)
        assert (seconds.tolist(), counts.tolist()) == expected
