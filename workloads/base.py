"""The two kinds of workload and how an engine drives them.

Open loop: `iter_requests(rng) -> Iterator[RequestSpec]`, arrival-sorted, ids "req-0", ...
Closed loop: `process(env, submit, rng)`, a SimPy generator; `submit(spec) -> simpy.Event`
hands a request to the engine and the event succeeds when that request finishes.
`as_process(workload)` gives every workload the closed-loop shape, so an engine needs one path.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, runtime_checkable

import numpy as np

from workloads.spec import RequestSpec

Submit = Callable[[RequestSpec], object]


@runtime_checkable
class OpenLoopWorkload(Protocol):
    """Arrivals fixed in advance, independent of the engine."""

    def iter_requests(self, rng: np.random.Generator) -> Iterator[RequestSpec]: ...


@runtime_checkable
class ClosedLoopWorkload(Protocol):
    """Arrivals that depend on completions (users wait for answers)."""

    def process(self, env, submit: Submit, rng: np.random.Generator): ...


Workload = OpenLoopWorkload | ClosedLoopWorkload


def is_closed_loop(workload) -> bool:
    """True when the workload needs engine feedback (has `process`)."""
    return isinstance(workload, ClosedLoopWorkload)


def feed(env, submit: Submit, specs: Iterable[RequestSpec]):
    """SimPy process: submit each spec at its arrival time (open-loop replay)."""
    for spec in specs:
        if spec.arrival_time_s > env.now:
            yield env.timeout(spec.arrival_time_s - env.now)
        submit(spec)


def as_process(workload) -> Callable:
    """`process(env, submit, rng)` for any workload (closed-loop ones are returned as is)."""
    if is_closed_loop(workload):
        return workload.process

    def process(env, submit: Submit, rng: np.random.Generator):
        yield from feed(env, submit, workload.iter_requests(rng))

    return process
