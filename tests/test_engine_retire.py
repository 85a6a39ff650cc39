"""Retiring stopped requests takes each off whichever queue holds it."""
from __future__ import annotations

import numpy as np

from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.request import RequestStatus
from sim.engine.engine import Engine
from workloads.spec import RequestSpec


def _engine_with(num_requests: int) -> tuple[Engine, list]:
    engine = Engine(EngineConfig(), LinearCostModel(), 1000)
    reqs = [engine.add_request(RequestSpec(0.0, np.arange(1, 20, dtype=np.int32), output_len=5), 0.0)
            for _ in range(num_requests)]
    return engine, reqs


def test_running_requests_leave_running_only():
    engine, reqs = _engine_with(4)
    engine.state.waiting.clear()
    engine.state.running = reqs[:3]
    engine.state.waiting.append(reqs[3])
    engine._drop_from_queues([reqs[0], reqs[2]])
    assert engine.state.running == [reqs[1]]
    assert list(engine.state.waiting) == [reqs[3]]


def test_a_preempted_request_that_stops_leaves_the_waiting_queue():
    """A request preempted while its sampling step was in flight waits again; if that step's token
    stops it, it leaves the waiting queue (beside running ones that stop in the same step)."""
    engine, reqs = _engine_with(4)
    engine.state.waiting.clear()
    engine.state.running = [reqs[0], reqs[1]]
    reqs[2].status = RequestStatus.PREEMPTED
    engine.state.waiting.extend([reqs[2], reqs[3]])
    engine._drop_from_queues([reqs[1], reqs[2]])
    assert engine.state.running == [reqs[0]]
    assert list(engine.state.waiting) == [reqs[3]]
