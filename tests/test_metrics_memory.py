"""The summary's statistics computed in place (latency percentiles on a scaled copy, peak rate
counted a chunk of requests at a time) give the same figures, bit for bit, as the plain formulas."""
from __future__ import annotations

from array import array

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from sim.api.metrics import latency_stats, peak_output_rate, percentile_word

floats = st.floats(0.0, 1e4, allow_nan=False)


def plain_latency_stats(values, metric, percentiles):
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)] * 1e3
    if not arr.size:
        return None
    out = {f"mean_{metric}_ms": float(arr.mean()), f"median_{metric}_ms": float(np.median(arr)),
           f"std_{metric}_ms": float(arr.std())}
    out.update({f"p{percentile_word(p)}_{metric}_ms": float(np.percentile(arr, p)) for p in percentiles})
    return out


def plain_peak(done, token_times):
    times = [np.asarray(token_times[i], dtype=float) for i in done.index
             if i < len(token_times) and token_times[i] is not None]
    times = np.concatenate(times) if times else np.empty(0)
    if not times.size:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    start = float(done["arrival_time"].min())
    counts = np.bincount(np.floor(times - start).astype(int).clip(min=0))
    second = int(counts.argmax())
    in_flight = (done["arrival_time"] < start + second + 1) & (done["finish_time"] >= start + second)
    return {"max_output_tokens_per_s": float(counts[second]), "max_concurrent_requests": int(in_flight.sum())}


@st.composite
def runs(draw):
    """Requests with sorted token times (repeated times: zero gaps), some None, some not completed."""
    n = draw(st.integers(0, 12))
    token_times, completed, arrivals = [], [], []
    for _ in range(n):
        arrival = draw(floats)
        gaps = draw(st.lists(st.sampled_from([0.0, 0.013, 0.5, 1.7]) | floats.map(lambda x: x / 1e3),
                             max_size=30))
        times = array("d", list(np.cumsum([arrival + 0.01, *gaps]))) if draw(st.booleans()) or not gaps else None
        token_times.append(times)
        completed.append(draw(st.booleans()))
        arrivals.append(arrival)
    return token_times, np.array(completed, dtype=bool), np.array(arrivals)


@given(st.lists(floats | st.just(float("nan")), max_size=40))
def test_latency_stats_in_place_equal_the_plain_formula(values):
    expected = plain_latency_stats(values, "itl", (90, 99, 99.9))
    got = latency_stats(np.array(values, dtype=float), "itl", (90, 99, 99.9))
    if expected is None:
        assert all(np.isnan(v) for v in got.values())
    else:
        assert got == expected and list(got) == list(expected)


def test_latency_stats_leaves_values_it_does_not_own():
    values = np.array([0.3, 0.1, float("nan"), 0.2])
    latency_stats(values, "ttft")
    assert np.array_equal(values, [0.3, 0.1, float("nan"), 0.2], equal_nan=True)


@given(runs(), st.integers(1, 4))
def test_peak_rate_counted_in_chunks_equals_all_at_once(run, chunk):
    token_times, completed, arrivals = run
    finish = [t[-1] if t is not None and len(t) else a for t, a in zip(token_times, arrivals)]
    requests = pd.DataFrame({"arrival_time": arrivals, "finish_time": np.array(finish, dtype=float)})
    done = requests[completed]
    assert peak_output_rate(done, token_times, chunk=chunk) == plain_peak(done, token_times)


def test_peak_rate_memory_does_not_grow_with_idle_time():
    """Tokens 1e8 s apart (a think time inside its documented range): a count over every second of
    the span would take gigabytes; the peak counts only the seconds that hold tokens."""
    import tracemalloc
    token_times = [array("d", [0.1, 0.2, 0.3]), array("d", [1e8 + 0.5, 1e8 + 0.6])]
    done = pd.DataFrame({"arrival_time": [0.0, 1e8], "finish_time": [0.3, 1e8 + 0.6]})
    tracemalloc.start()
    try:
        peak = peak_output_rate(done, token_times)
        assert tracemalloc.get_traced_memory()[1] < 2**20
    finally:
        tracemalloc.stop()
    assert peak == {"max_output_tokens_per_s": 3.0, "max_concurrent_requests": 1}


def test_a_closed_loop_with_a_long_think_time_summarizes():
    from sim.api.simulator import SimulationConfig, simulate
    config = SimulationConfig().replace(deployment={"cost_model": "linear"}, workload={
        "kind": "closed_loop", "num_users": 2, "think_time_s": 1e9, "num_requests": 6, "lengths": "sharegpt"})
    summary = simulate(config).summary
    assert summary["completed"] == 6 and summary["max_output_tokens_per_s"] > 0


@given(st.lists(st.tuples(st.integers(0, 500), st.floats(0.0, 2.0, allow_nan=False)), min_size=1, max_size=60))
def test_kv_occupancy_in_place_equals_the_plain_formula(rows):
    from sim.api.metrics import kv_occupancy
    steps = pd.DataFrame({"kv_blocks_used": [b for b, _ in rows], "duration": [d for _, d in rows]})
    occ = steps["kv_blocks_used"].to_numpy(dtype=float) / 500
    dur = steps["duration"].to_numpy()
    total = dur.sum()
    plain = {"kv_occupancy_mean": float((occ * dur).sum() / total) if total else float(occ.mean()),
             "kv_occupancy_peak": float(occ.max()),
             "kv_time_above_90pct": float(dur[occ > 0.9].sum() / total) if total else 0.0}
    assert kv_occupancy(steps, 500) == plain
