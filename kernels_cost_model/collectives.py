"""Measured collective-communication figures for GPUs whose links the datasheet does not describe well.

A PCIe-only GPU's all-reduce is far from its link's datasheet rate: NCCL pays ~25 us a call and reaches
a fraction of the PCIe bandwidth. `data/collectives.csv` holds measured figures (latency of a small
all-reduce, nccl-tests bus bandwidth of a large one) with their source; the uncalibrated roofline uses
them in place of its default all-reduce efficiency.
"""
from __future__ import annotations

from functools import lru_cache

from ._catalog import read_catalog
from .roofline import Coeffs


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
