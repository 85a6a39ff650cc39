"""Clocks under the power cap: compute-bound kernels slow down when the GPU runs them without rest.

Kernel tables (AIConfigurator's, servesim's torch backend) time short bursts of a kernel, at the boost
clock. A serving engine under load runs steps back to back: where they are compute-heavy (prefill chunks,
large decode batches) the board reaches its power limit and the driver holds the SM clock down (NVML's
"SW power cap"). Measured on an H100 SXM and an H200 (700 W each; `benchmarks/matmul_sustained.py`,
`data/measured/<gpu>-matmul-sustained.csv`): run back to back for 2 s, a GEMM bound by compute takes
1.09-1.13x (H100) and 1.18-1.19x (H200) its time after an idle pause, at an SM clock of ~1,350-1,550
against 1,980 MHz, while one bound by reading its weights (up to ~128 rows) takes the same time, and
causal prefill attention slows like the GEMMs (1.11x at 16,384 tokens on the H100).

With `clocks="sustained"` servesim prices compute at `sustained_compute_factor(gpu)` times the burst
rate: each family's seconds per FLOP (and per key of a causal prefill launch's critical path, per row of
a serial in-chunk loop) scaled, the memory side, a decode's loop over the cache and the launch overheads
left alone; the roofline's max(compute, memory) then decides which kernels slow. It is a choice, not the
default (`"burst"`): the driver caps the board's power averaged over time, not each kernel's. A burst of
39 ms after a rest ran at the boost clock, and a whole decode step of 14 ms too; 20 steps back to back
(0.3 s) ran capped. So a GPU whose load is mostly memory-bound decodes with a chunk now and then may stay
under its cap, while one kept busy by compute (offline batches, long prompts under load, large decode
batches) runs at the capped clock throughout; servesim does not follow the power over time.

A GPU with no such measurement keeps its burst clocks (factor 1): the factor follows a board's power
limit against its chip's appetite, which two boards of one architecture cannot give for others.
"""
from __future__ import annotations

import csv
import dataclasses
import statistics
from functools import lru_cache

from .calibration import Calibration
from .gpu_calibration import MEASURED_DIR
from .roofline import PREFILL_FAMILIES, Coeffs

#: The clock regimes a deployment may price at.
CLOCKS = ("sustained", "burst")
#: GEMMs of at least this many rows are bound by compute on both measured GPUs (by 3x or more in the
#: shipped roofline): their sustained / after-idle ratio is the compute factor.
COMPUTE_BOUND_ROWS = 1024
#: Coefficients that price SM-clock-bound work (roofline.Coeffs fields); a causal prefill launch's cost per
#: key of its critical path too (its unit's loop computes each key block: `PREFILL_KEY_FIELDS`), not a
#: decode's (its loop reads the cache).
COMPUTE_FIELDS = ("s_per_flop", "s_per_attention_flop", "s_per_chunk_row")
PREFILL_KEY_FIELDS = (*COMPUTE_FIELDS, "s_per_key")


@lru_cache(maxsize=None)
def sustained_compute_factor(gpu: str) -> float:
    """Time of compute-bound work run back to back over its time after a rest, on `gpu` (catalog name):
    the median over the measured GEMMs of COMPUTE_BOUND_ROWS rows and more, every run of that GPU; 1.0
    where none was measured."""
    ratios = []
    for path in sorted(MEASURED_DIR.glob(f"{gpu}-matmul-sustained*.csv")):
        ratios += _gemm_ratios(path)
    return statistics.median(ratios) if ratios else 1.0


def _gemm_ratios(path) -> list[float]:
    times: dict[tuple[int, str], float] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if row["form"].startswith("gate_up_"):
                times[(int(row["rows"]), row["form"])] = float(row["per_call_s"])
    return [times[(m, "gate_up_sustained")] / times[(m, "gate_up_after_idle")]
            for m, form in sorted(times) if form == "gate_up_after_idle" and m >= COMPUTE_BOUND_ROWS
            and (m, "gate_up_sustained") in times]


def at_clocks(cal: Calibration, gpu: str, clocks: str) -> tuple[Calibration, float]:
    """(`cal` with its compute priced at `clocks` on `gpu`, the factor applied: 1.0 leaves it as it is)."""
    factor = sustained_compute_factor(gpu) if clocks == "sustained" else 1.0
    if factor == 1.0:
        return cal, factor
    coeffs = {key: _scaled(c, PREFILL_KEY_FIELDS if key.startswith(PREFILL_FAMILIES) else COMPUTE_FIELDS, factor)
              for key, c in cal.coeffs.items()}
    regimes = {key: g.scaled(factor, 1.0) for key, g in cal.regimes.items()}
    return dataclasses.replace(cal, coeffs=coeffs, regimes=regimes), factor


def _scaled(c: Coeffs, fields: tuple[str, ...], factor: float) -> Coeffs:
    return dataclasses.replace(c, **{f: getattr(c, f) * factor for f in fields})
