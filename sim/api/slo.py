"""SLOConfig: the latency targets a run is summarised against (its own module: Results checks them too)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sim.api.validation import check_slo


@dataclass(frozen=True)
class SLOConfig:
    """Latency targets for goodput and SLO attainment (None: not constrained)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        check_slo(self)

    def as_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
