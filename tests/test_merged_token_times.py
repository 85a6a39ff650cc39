"""merge_results references the runs' token times (sim.core.token_runs.MergedTokenTimes) instead of
copying every time into a list: the merged sequence reads the same times, the summary is unchanged."""
from __future__ import annotations

from array import array

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from sim.api.itl import itl_chunks
from sim.api.metrics import itl_stats, summarize
from sim.api.results import merge_results
from sim.core.token_runs import MergedTokenTimes


@given(st.lists(st.integers(0, 5), min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_merged_sequence_reads_the_reordered_times(sizes, rng):
    parts = [[array("d", [float(p), float(i)]) for i in range(n)] for p, n in enumerate(sizes)]
    pooled = [t for p in parts for t in p]
    order = list(range(len(pooled)))
    rng.shuffle(order)
    merged = MergedTokenTimes(parts, order)
    assert len(merged) == len(pooled) and merged == [pooled[i] for i in order]
    assert merged[1:3] == [pooled[i] for i in order][1:3]
    completed = np.array([rng.random() < 0.6 for _ in order], dtype=bool)
    picked = {order[i] for i in np.flatnonzero(completed)}  # positions in the runs laid end to end
    offset = 0
    for (times, chosen), part in zip(merged.split(completed), parts):
        assert times is part
        assert chosen.tolist() == [offset + j in picked for j in range(len(part))]
        offset += len(part)


def test_merged_summary_equals_the_one_from_copied_times():
    """Three runs (times kept as runs) merged: the summary equals summarize() on the copied list."""
    from sim import SimulationConfig, simulate
    config = SimulationConfig().replace(workload={"rate": 20.0, "num_requests": 30})
    parts = [simulate(config.replace(seed=seed)) for seed in (1, 2, 3)]
    merged = merge_results(parts, {}, {})
    assert isinstance(merged.token_times, MergedTokenTimes)
    assert all(times is p.token_times for times, p in zip(merged.token_times.parts, parts))  # referenced
    arrival = pd.concat([p.requests for p in parts], ignore_index=True)["arrival_time"].to_numpy()
    copied = [t for p in parts for t in p.token_times]
    copied = [copied[i] for i in np.argsort(arrival, kind="stable")]
    assert merged.token_times == copied
    expected = summarize(merged.requests, merged.steps.iloc[0:0], copied, merged.meta["num_gpu_blocks"], {})
    for key in ("kv_occupancy_mean", "kv_occupancy_peak", "kv_time_above_90pct"):
        expected[key] = merged.summary[key]
    assert repr(merged.summary) == repr(expected)
    completed = np.array(merged.requests["completed"], dtype=bool)
    completed[::4] = False
    assert itl_stats(merged.token_times, completed) == itl_stats(copied, completed)
    assert any(not isinstance(c, tuple) for c in itl_chunks(merged.token_times, completed))  # step gaps kept
