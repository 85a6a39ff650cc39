"""Mixes: several request classes (e.g. interactive chat + batch summarisation), each with its own
arrivals, lengths, priority and SLOs, merged into one arrival-sorted stream (tenant = class name).
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from kernels_cost_model.errors import require
from sim.core.fields import check_types
from workloads.arrivals import Poisson
from workloads.spec import RequestSpec
from workloads.synthetic import SyntheticWorkload


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """A named class of requests: an open-loop workload plus priority and SLOs (seconds)."""

    name: str
    workload: object
    priority: int = 0
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.name, str) and self.name != "", "name", self.name, "must be a non-empty string")
        check_types(self, f"{self.name}.")
        require(hasattr(self.workload, "iter_requests"), f"{self.name}.workload", self.workload,
                "must be an open-loop workload (iter_requests)")
        for key in ("ttft_slo_s", "tpot_slo_s"):
            value = getattr(self, key)
            require(value is None or value > 0, f"{self.name}.{key}", value, "must be > 0 or None")


def workload_class(name: str, rate: float, lengths="sharegpt", *, num_requests: int | None = None,
                   duration_s: float | None = None, priority: int = 0, ttft_slo_s: float | None = None,
                   tpot_slo_s: float | None = None, **kwargs) -> WorkloadClass:
    """A Poisson class in one line, e.g. workload_class("chat", 5, "sharegpt", duration_s=60, ttft_slo_s=0.5)."""
    workload = SyntheticWorkload(Poisson(rate), lengths, num_requests, duration_s, **kwargs)
    return WorkloadClass(name, workload, priority, ttft_slo_s, tpot_slo_s)


@dataclass(frozen=True, slots=True)
class Mix:
    """Classes merged by arrival time (ties: class order); ids re-assigned "req-0", ..."""

    classes: tuple[WorkloadClass, ...]

    def __post_init__(self) -> None:
        classes = tuple(self.classes)
        require(len(classes) >= 1, "classes", classes, "needs at least one class")
        for i, c in enumerate(classes):
            require(isinstance(c, WorkloadClass), f"classes[{i}]", c,
                    "must be a WorkloadClass, e.g. workload_class(\"chat\", 5, \"sharegpt\", duration_s=60)")
        names = [c.name for c in classes]
        require(len(set(names)) == len(names), "classes", names, "class names must be unique")
        object.__setattr__(self, "classes", classes)

    def slos(self) -> dict[str, dict[str, float | None]]:
        """{tenant: {"ttft_slo_s": ..., "tpot_slo_s": ...}} for goodput accounting."""
        return {c.name: {"ttft_slo_s": c.ttft_slo_s, "tpot_slo_s": c.tpot_slo_s} for c in self.classes}

    def iter_requests(self, rng: np.random.Generator) -> Iterator[RequestSpec]:
        streams = [self._tagged(c, k, r) for k, (c, r) in enumerate(zip(self.classes, rng.spawn(len(self.classes))))]
        for i, (_, spec) in enumerate(heapq.merge(*streams, key=lambda item: item[0])):
            yield replace(spec, request_id=f"req-{i}")

    @staticmethod
    def _tagged(klass: WorkloadClass, k: int, rng: np.random.Generator):
        for j, spec in enumerate(klass.workload.iter_requests(rng)):
            session = None if spec.session_id is None else f"{klass.name}/{spec.session_id}"
            yield (spec.arrival_time_s, k, j), replace(spec, tenant=klass.name, priority=klass.priority,
                                                       session_id=session)
