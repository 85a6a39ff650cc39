"""Measured collective-communication figures for GPUs whose links the datasheet does not describe well.

A PCIe-only GPU's all-reduce is far from its link's datasheet rate: NCCL pays ~10-25 us a call and its
bus bandwidth ramps up with the message size (a few GB/s at 100 KB, ~35 GB/s from 8 MB on two RTX PRO
6000s). Two catalogs, each row with its source:

- `data/collective_curves.csv`: measured time by message size for (GPU, number of ranks, collective).
  Where one exists, a collective costs the measured time at its size (linear between the measured
  sizes, the last segment's slope beyond them, the smallest size's time below them), i.e.
  latency + size / busbw(size) with the measured, size-dependent bus bandwidth.
- `data/collectives.csv`: one latency and one large-message bus bandwidth per GPU, the fallback for
  other rank counts (the uncalibrated roofline uses it in place of its default all-reduce efficiency).
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from functools import lru_cache
from statistics import median

from kernels_cost_model.errors import require

from ._catalog import read_catalog
from .roofline import Coeffs

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True, slots=True)
class CollectiveCurve:
    """Seconds of one collective by message size (bytes), from measured points, monotone by construction."""

    sizes: tuple[float, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        require(len(self.sizes) >= 2 and len(self.sizes) == len(self.seconds), "sizes", len(self.sizes),
                "need at least two measured sizes, one time each")
        require(all(a < b for a, b in zip(self.sizes, self.sizes[1:])), "sizes", self.sizes, "must increase")
        require(all(a <= b for a, b in zip(self.seconds, self.seconds[1:])) and self.seconds[0] > 0,
                "seconds", self.seconds, "must be > 0 and non-decreasing")

    @classmethod
    def from_points(cls, points) -> "CollectiveCurve":
        """From (bytes, seconds) measurements: repeats of a size merged to their median, sorted by size,
        each time raised to the largest time of any smaller size (measurement noise can make a larger
        message read faster)."""
        by_size: dict[float, list[float]] = {}
        for size, sec in points:
            by_size.setdefault(float(size), []).append(float(sec))
        sizes, seconds, top = [], [], 0.0
        for size, secs in sorted(by_size.items()):
            sec = median(secs)
            top = max(top, sec)
            sizes.append(float(size))
            seconds.append(top)
        return cls(tuple(sizes), tuple(seconds))

    def time(self, nbytes: float) -> float:
        s, t = self.sizes, self.seconds
        if nbytes <= s[0]:
            return t[0]
        i = bisect_left(s, nbytes)
        if i == len(s):  # beyond the sweep: the last segment's bandwidth
            i -= 1
        return t[i - 1] + (nbytes - s[i - 1]) * (t[i] - t[i - 1]) / (s[i] - s[i - 1])


@lru_cache(maxsize=1)
def _curve_points() -> dict[tuple[str, int, str], list[tuple[float, float]]]:
    points: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
    for row in read_catalog("collective_curves.csv"):
        key = (row["gpu"], int(row["ranks"]), row["collective"])
        points.setdefault(key, []).append((float(row["bytes"]), float(row["seconds"])))
    return points


@lru_cache(maxsize=None)
def collective_curve(gpu_name: str, ranks: int, collective: str) -> CollectiveCurve | None:
    """Measured curve of `collective` over `ranks` GPUs of this kind, or None where none was measured."""
    require(collective in COLLECTIVES, "collective", collective, f"must be one of {COLLECTIVES}")
    points = _curve_points().get((gpu_name, int(ranks), collective))
    return CollectiveCurve.from_points(points) if points else None


@lru_cache(maxsize=1)
def _rows() -> dict[str, dict[str, str]]:
    return {row["gpu"]: row for row in read_catalog("collectives.csv")}


def measured_all_reduce(gpu_name: str) -> Coeffs | None:
    """All-reduce coefficients (seconds per bus byte, per call) measured for this GPU, or None."""
    row = _rows().get(gpu_name)
    if row is None:
        return None
    return Coeffs(0.0, 1.0 / float(row["all_reduce_bus_bytes_per_s"]), float(row["all_reduce_latency_s"]))


def collective_source(gpu_name: str) -> str | None:
    row = _rows().get(gpu_name)
    return row["source"] if row else None
