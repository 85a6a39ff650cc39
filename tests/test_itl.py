"""ITL statistics from weighted chunks (sim.api.itl): the median and percentiles equal numpy's on the
pooled gaps bit for bit, the mean and std are the exactly rounded ones (within an ulp of numpy's),
and token times kept as runs give the same figures as arrays, without pooling the gaps."""
from __future__ import annotations

import math
from array import array
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api.itl import CHUNK, StepGaps, each, itl_chunks, order_statistic, sqrt_rounded, weighted_stats
from sim.api.metrics import itl_stats, latency_stats
from tests.itl_reference import pooled_itl
from tests.test_token_runs import _Steps, _timelines, compacted
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.token_runs import TokenRuns, TokenTimes
from sim.engine.simulation import run_engine
from workloads import poisson_workload

PERCENTILES = (50, 90, 99, 99.9)
gap = st.sampled_from([0.013, 0.0125, 0.5, 1e-6]) | st.floats(1e-7, 10.0)


def key(stat):
    return f"{stat}_itl_ms" if isinstance(stat, str) else f"p{stat}_itl_ms"


def exact(pooled_ms: np.ndarray) -> tuple[float, float]:
    """Exactly rounded mean and population std, with fractions."""
    values = [Fraction(float(v)) for v in pooled_ms]
    mean = sum(values, Fraction(0)) / len(values)
    variance = sum(((v - mean) ** 2 for v in values), Fraction(0)) / len(values)
    return float(mean), sqrt_rounded(variance)


def check_against_pooled(chunks, pooled_ms: np.ndarray) -> None:
    got = weighted_stats(chunks, PERCENTILES, key)
    numpy_stats = latency_stats(pooled_ms / 1e3, "itl", PERCENTILES)
    for p in PERCENTILES:  # order statistics: numpy's, bit for bit
        assert got[key(p)] == numpy_stats[f"p{p}_itl_ms"] == np.percentile(pooled_ms, p)
    assert got[key("median")] == np.median(pooled_ms)
    mean, std = exact(pooled_ms)
    assert (got[key("mean")], got[key("std")]) == (mean, std)
    assert got[key("mean")] == pytest.approx(numpy_stats["mean_itl_ms"], rel=1e-15)
    # numpy's std carries its mean's rounding (equal gaps: ~1e-12, not 0)
    assert got[key("std")] == pytest.approx(numpy_stats["std_itl_ms"], rel=1e-12, abs=1e-12 * mean)


@settings(max_examples=60)
@given(st.lists(st.tuples(gap, st.integers(1, 300)), min_size=1, max_size=60), st.integers(1, 7))
def test_weighted_runs_give_the_statistics_of_their_pooled_gaps(pairs, pieces):
    values = np.array([v for v, _ in pairs]) * 1e3
    counts = np.array([c for _, c in pairs], dtype=np.int32)
    cut = sorted({0, len(pairs), *np.linspace(0, len(pairs), pieces).astype(int).tolist()})
    chunks = [(values[a:b], counts[a:b]) for a, b in zip(cut, cut[1:])]
    check_against_pooled(chunks, np.repeat(values, counts))


@settings(max_examples=40)
@given(st.lists(gap, min_size=1, max_size=80))
def test_unweighted_chunks_give_numpys_order_statistics(gaps):
    values = np.array(gaps) * 1e3
    check_against_pooled([(values[:5], None), (values[5:], None)], values)


def test_selection_narrows_large_chunks_exactly():
    """More entries than a selection step gathers: histogram levels pick the same order statistics."""
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.exponential(20.0, CHUNK + 5000), np.full(CHUNK, 12.5)])
    counts = rng.integers(1, 4, len(values)).astype(np.int32)
    chunks = [(values[i:i + 100_000], counts[i:i + 100_000]) for i in range(0, len(values), 100_000)]
    pooled = np.sort(np.repeat(values, counts))
    for rank in (0, 1, len(pooled) // 3, len(pooled) // 2, len(pooled) - 1):
        assert order_statistic(chunks, rank) == pooled[rank]
    got = weighted_stats(chunks, (90, 99), key)
    assert got[key(90)] == np.percentile(pooled, 90) and got[key("median")] == np.median(pooled)


def test_no_gaps_give_nan():
    got = weighted_stats([], (90,), key)
    assert all(math.isnan(v) for v in got.values()) and list(got) == [key("mean"), key("median"), key("std"), key(90)]


@given(st.fractions(min_value=0, max_value=10**12))
def test_sqrt_rounded_is_the_nearest_float(x):
    root = sqrt_rounded(x)
    err = abs(Fraction(root) ** 2 - x)
    for neighbour in (math.nextafter(root, 0), math.nextafter(root, math.inf)):
        assert err <= abs(Fraction(neighbour) ** 2 - x) or x == 0


@pytest.mark.parametrize("mode", ["step", "fast"])
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_runs_and_arrays_give_the_same_itl_as_the_pooled_gaps(mode, async_scheduling):
    """A run with preemptions: the runs' weighted chunks hold the pooled gaps' multiset, and the
    statistics equal across storage modes and engine modes."""
    config = EngineConfig(num_gpu_blocks=1_500, max_model_len=16384, max_num_batched_tokens=8192,
                          async_scheduling=async_scheduling, mode=mode)
    workload = poisson_workload(rate=30.0, num_requests=60, lengths="sharegpt")
    plain = run_engine(workload, config, LinearCostModel())
    runs = run_engine(workload, replace(config, record_token_times="runs"), LinearCostModel())
    completed = np.array([r in ("stop", "length") for r in plain.requests.finish_reason])
    completed[::7] = False
    times = runs.requests.times()
    assert isinstance(times, TokenTimes)
    chunks = itl_chunks(times, completed)
    assert any(isinstance(c, StepGaps) for c in chunks)  # weighted step gaps were used
    pooled = pooled_itl(plain.requests.times(), completed) * 1e3
    weighted = np.concatenate([v if c is None else np.repeat(v, c) for v, c in each(chunks)])
    assert np.array_equal(np.sort(weighted), np.sort(pooled))
    stats = itl_stats(times, completed, PERCENTILES)
    assert stats == itl_stats(plain.requests.times(), completed, PERCENTILES)
    assert stats == itl_stats(list(times), completed, PERCENTILES)
    check_against_pooled(chunks, pooled)
    if mode == "fast":
        step = run_engine(workload, replace(config, mode="step", record_token_times="runs"), LinearCostModel())
        assert itl_stats(step.requests.times(), completed, PERCENTILES) == stats


def test_requests_with_times_off_the_steps_are_read_explicitly():
    """Times no step started at (extras) and uncompacted requests: their gaps counted one by one."""
    class Steps:
        start_time = array("d", [0.0, 0.5, 1.0, 1.25, 2.0, 3.0])
    store = TokenRuns(Steps())
    live = []
    for times in ([0.5, 1.0, 1.25, 2.0], [0.0, 0.5, 0.7, 1.0, 3.0], [1.0, 1.0, 2.0, 3.0], [0.25, 4.0]):
        store.add_request()
        live.append(array("d", times))
    for i in range(3):
        store.finish(i, live)
    store.compact(live)
    times = TokenTimes(live, store)
    completed = np.array([True, True, True, True])
    pooled = pooled_itl([array("d", t) for t in times], completed) * 1e3
    chunks = itl_chunks(times, completed)
    weighted = np.concatenate([v if c is None else np.repeat(v, c) for v, c in each(chunks)])
    assert np.array_equal(np.sort(weighted), np.sort(pooled))


def test_simulate_keeps_token_times_as_runs_with_the_same_results(monkeypatch):
    """simulate() runs the engine with token times as runs: the results equal those of arrays."""
    from sim import SimulationConfig, simulate
    from sim.api import simulator
    config = SimulationConfig().replace(workload={"rate": 20.0, "num_requests": 40})
    runs = simulate(config)
    assert isinstance(runs.token_times, TokenTimes)
    monkeypatch.setattr(simulator, "token_times_as_runs", lambda engine: engine)
    arrays = simulate(config)
    assert isinstance(arrays.token_times, list) and runs.token_times == arrays.token_times
    assert repr(runs.summary) == repr(arrays.summary)
    assert runs.requests.equals(arrays.requests) and runs.steps.equals(arrays.steps)
    off = simulate(config.replace(engine={"record_token_times": False}))
    assert all(t is None for t in off.token_times)


def test_release_freed_memory_runs_anywhere():
    from sim.api.memory import release_freed_memory
    release_freed_memory()  # glibc: malloc_trim; elsewhere only a collection, never an error
def test_release_skips_short_runs(monkeypatch):
    import sim.api.memory as memory
    calls = []
    monkeypatch.setattr(memory.gc, "collect", lambda: calls.append(1))
    memory.release_freed_memory(memory.RELEASE_FROM_REQUESTS - 1)
    assert calls == []
    memory.release_freed_memory(memory.RELEASE_FROM_REQUESTS)
    assert calls == [1]


@settings(max_examples=40)
@given(_timelines(), st.data())
def test_any_runs_give_the_chunks_of_their_pooled_gaps(timeline, data):
    """Runs split over several pairs, far apart, several tokens at one step's time, times off the
    steps, some requests not completed: the weighted chunks hold exactly the pooled gaps."""
    starts, requests = timeline
    store, live = compacted(starts, requests)
    completed = np.array(data.draw(st.lists(st.booleans(), min_size=len(requests), max_size=len(requests))))
    pooled = pooled_itl([array("d", t) for t in requests], completed) * 1e3
    chunks = itl_chunks(TokenTimes(live, store), completed)
    weighted = np.concatenate([np.zeros(0), *(v if c is None else np.repeat(v, c) for v, c in each(chunks))])
    assert np.array_equal(np.sort(weighted), np.sort(pooled))


def test_the_mmap_threshold_is_fixed_only_before_long_runs(monkeypatch):
    import sim.api.memory as memory
    calls = []
    monkeypatch.setattr(memory, "_libc_function", lambda name: lambda *args: calls.append((name, *args)))
    memory.keep_large_blocks_apart(None)
    memory.keep_large_blocks_apart(memory.RELEASE_FROM_REQUESTS - 1)
    assert calls == []
    memory.keep_large_blocks_apart(memory.RELEASE_FROM_REQUESTS)
    assert calls == [("mallopt", memory.M_MMAP_THRESHOLD, memory.MMAP_THRESHOLD),
                     ("mallopt", memory.M_TRIM_THRESHOLD, memory.TRIM_THRESHOLD)]


def test_more_runs_than_a_byte_counts_over_one_gap_widen_the_counts():
    """300 requests over the same steps (one run each, some split by a skipped step): counts past 255."""
    starts = np.cumsum(np.full(40, 0.5)).tolist()
    store = TokenRuns(_Steps(starts))
    plain = [array("d", starts[i % 7:30] if i % 3 else starts[2:9] + starts[10:20]) for i in range(300)]
    live = [array("d", t) for t in plain]
    for index in range(len(live)):
        store.add_request()
        store.finish(index, live)
    store.compact(live)
    completed = np.ones(300, dtype=bool)
    chunks = itl_chunks(TokenTimes(live, store), completed)
    assert max(int(c.spanning.max()) for c in chunks if isinstance(c, StepGaps)) > 255
    pooled = pooled_itl(plain, completed) * 1e3
    weighted = np.concatenate([v if c is None else np.repeat(v, c) for v, c in each(chunks)])
    assert np.array_equal(np.sort(weighted), np.sort(pooled))
