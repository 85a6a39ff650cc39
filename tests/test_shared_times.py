"""Shared step times (sim.engine.shared_times): a step that schedules every running request times
their tokens with one slot; the requests' lists come out as if each row had appended its own."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sim.engine.shared_times as shared_times
from sim.core.config import EngineConfig
from sim.engine.engine import Engine
from sim.engine.shared_times import NOTHING_OWED, SharedTimes
from workloads import poisson_workload
from tests.test_fast_mode import assert_identical, run_both


class _Req:
    def __init__(self):
        self.times_mark = NOTHING_OWED


# per step: (does it take a slot?, per request: None (not in the step, or where the step takes a slot
# "other"), "main" (timed by the step), "other" (in the step, no token: stopped, mid-prefill) or "own"
# (in the step, no token of the slot's but one of its own, as a stale row's))
_steps = st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from([None, "main", "other", "own"]),
                                                    min_size=4, max_size=4)), max_size=40)


@given(_steps, st.lists(st.sampled_from(["join", "leave", "read"]), min_size=40, max_size=40),
       st.lists(st.integers(0, 3), min_size=40, max_size=40))
def test_lists_are_what_each_row_appending_its_own_gives(steps, moves, who):
    """Each step's rows on the main path are timed by its slot (when it covers); the others skip it
    and may append their own; requests join, leave and have their lists read between steps: every
    list equals the one built by appending each time as it comes."""
    shared, reqs = SharedTimes(), [_Req() for _ in range(4)]
    lists, expected, running = [[] for _ in reqs], [[] for _ in reqs], [False] * 4
    for k, (covers, rows) in enumerate(steps):
        now = float(k + 1)
        slot = shared.take() if covers else None
        if slot is not None:
            shared.write(slot, now, [r for r, on in zip(reqs, running) if on])
        for i, row in enumerate(rows):
            if not running[i]:
                continue
            if row is None:
                if covers:  # (a step that takes a slot schedules every running request)
                    row = "other"
                else:
                    continue
            if row == "main":
                expected[i].append(now)
                if slot is None:
                    shared.catch_up(reqs[i], lists[i])
                    lists[i].append(now)
                continue
            if slot is not None:
                shared.skip(reqs[i], lists[i], slot)
            if row == "own":
                expected[i].append(now)
                shared.catch_up(reqs[i], lists[i])
                lists[i].append(now)
        i, move = who[k], moves[k]
        if move == "join" and not running[i]:
            shared.join(reqs[i])
            running[i] = True
        elif move == "leave" and running[i]:
            shared.leave(reqs[i], lists[i])
            running[i] = False
        elif move == "read":
            shared.catch_up(reqs[i], lists[i])
            assert lists[i] == expected[i]
    for req, times in zip(reqs, lists):
        shared.catch_up(req, times)
    assert lists == expected


def test_a_slot_finished_out_of_order_is_an_error():
    shared = SharedTimes()
    shared.take(), shared.take()
    with pytest.raises(RuntimeError, match="slot 1 finished out of order"):
        shared.write(1, 1.0, [])


def test_a_leap_past_a_slot_not_written_is_an_error():
    """A leap writes its units' slots next: any slot taken and not written but the step in flight's
    would be written out of order."""
    shared = SharedTimes()
    shared.take()
    with pytest.raises(RuntimeError, match=r"slots \(0,\) taken and not written"):
        shared.stretch([], [], None, [1.0], None)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_fast_runs_use_slots_and_drop_old_times(async_scheduling, monkeypatch):
    """A fast run under vLLM V0's policy times its full steps with slots, drops the times no running
    request is owed (here every 4 slots) and still gives the step mode's records; the step mode takes
    no slot, nor does vLLM V1's policy (its steps often leave a finishing request out)."""
    monkeypatch.setattr(shared_times, "COMPACT_EVERY", 4)
    engines, records = [], Engine.records

    def kept(self, end_time):
        engines.append(self)
        return records(self, end_time)

    monkeypatch.setattr(Engine, "records", kept)
    config = EngineConfig(policy="vllm-v0", num_gpu_blocks=600, max_model_len=2048, max_num_batched_tokens=2048,
                          max_num_seqs=32, async_scheduling=async_scheduling)
    workload = poisson_workload(rate=40.0, num_requests=120, lengths="sharegpt")
    specs = list(workload.iter_requests(np.random.default_rng(3)))
    assert_identical(*run_both(specs, config))
    step, fast = (engine.shared_times for engine in engines)
    assert step is None
    assert fast.written > 40 and fast.base > 0 and len(fast.times) < fast.written
    assert_identical(*run_both(specs, replace(config, policy="vllm")))
    assert engines[-1].shared_times is None
