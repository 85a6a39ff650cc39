"""The runs' host figures a replay prices with: measured-sweep defaults, or the end-to-end fit."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostFit:
    """collective_scale: serving collectives / the measured NCCL sweep; cpu_per_request_s: engine
    time per scheduled request per step that the GPU work does not hide (None = the model default)."""

    collective_scale: float = 1.0
    cpu_per_request_s: float | None = None


#: Nothing fitted end to end: measured kernels and collectives, the CPU term measured on vLLM's
#: scheduler (kernels_cost_model/scheduler_cpu.py).
UNFITTED = HostFit()
