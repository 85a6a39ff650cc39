"""The ITL panel of the latency CDFs is drawn from distinct gaps and their counts (sim.api.itl), never
the pooled gaps: its line, percentile marks and tail clipping equal those drawn from the pooled gaps."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim.api.itl import distinct_counts, sorted_percentile
from tests.itl_reference import pooled_itl
from sim.plots.run_plots import CLIP_PERCENTILE, cdf_points, latency_counts, plot_latency_cdfs, tail_edge


def pooled_points(pooled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The old line (every value, y = 1/n .. n/n) less the points inside vertical runs."""
    x = np.sort(pooled)
    y = np.arange(1, x.size + 1) / x.size
    inside = np.zeros(x.size, dtype=bool)
    inside[1:-1] = (x[1:-1] == x[:-2]) & (x[1:-1] == x[2:])
    return x[~inside], y[~inside]


@given(st.lists(st.sampled_from([0.5, 1.0, 1.25, 3.0]) | st.floats(1e-3, 1e3), min_size=1, max_size=300))
def test_weighted_cdf_and_percentiles_equal_the_pooled_ones(pooled):
    pooled = np.array(pooled)
    values, counts = distinct_counts([(pooled, None)])
    x, y = cdf_points(values, counts)
    px, py = pooled_points(pooled)
    assert np.array_equal(x, px) and np.array_equal(y, py)
    cumulative = np.cumsum(counts)
    for q in (50, 99):
        assert sorted_percentile(values, cumulative, q) == np.percentile(pooled, q)
    assert tail_edge(values, cumulative) == np.percentile(pooled, CLIP_PERCENTILE, method="lower")


def test_the_itl_panel_draws_the_pooled_gaps_figure():
    """A small run (token times kept as runs): the panel's line and marks equal the pooled gaps' ones."""
    from sim import SimulationConfig, simulate
    results = simulate(SimulationConfig().replace(workload={"rate": 20.0, "num_requests": 40}))
    pooled = pooled_itl(results.token_times, results.requests["completed"].astype(bool)) * 1e3
    values, counts, unit = latency_counts(results, "itl")
    assert unit == "ms" and int(counts.sum()) == pooled.size and counts.max() > 1
    assert np.array_equal(np.repeat(values, counts), np.sort(pooled))
    ax = plot_latency_cdfs(results).axes[2]
    x, y = ax.lines[0].get_data()
    px, py = pooled_points(pooled)
    assert np.array_equal(x, px) and np.array_equal(y, py)
    marks = [line.get_xdata()[0] for line in ax.lines[1:]]
    assert marks == [np.percentile(pooled, 50), np.percentile(pooled, 99)]


@given(st.lists(st.tuples(st.lists(st.sampled_from([0.5, 1.0, 3.0]) | st.floats(1e-3, 1e3), max_size=12),
                          st.booleans()), max_size=30))
def test_distinct_counts_merged_in_parts_equal_the_pooled_ones(chunks):
    """Many small chunks (CHUNK of 2: a part every 8 entries, merged up a stack): the same sorted
    distinct values and counts as counting the pooled entries at once."""
    import sim.api.itl as itl
    given_chunks, pooled = [], []
    for values, weighted in chunks:
        v = np.array(values, dtype=float)
        counts = np.arange(1, len(v) + 1, dtype=np.int64) if weighted else None
        given_chunks.append((v, counts))
        pooled.extend(np.repeat(v, counts) if weighted else v)
    chunk = itl.CHUNK
    itl.CHUNK = 2
    try:
        values, counts = distinct_counts(given_chunks)
    finally:
        itl.CHUNK = chunk
    expected_values, expected_counts = np.unique(np.array(pooled, dtype=float), return_counts=True)
    assert np.array_equal(values, expected_values) and np.array_equal(counts, expected_counts)
    assert counts.dtype == np.int64
