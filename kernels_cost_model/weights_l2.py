"""GEMM weights in L2: a benchmark state, kept apart from serving.

AIConfigurator's GEMM collector (`collector/vllm/collect_gemm.py`; data/kernel_profiles README, "Each CUDA
graph cycles through 6 copies of the layer ... and the time is divided by 6") cycles GEMM_WEIGHT_COPIES
copies of the weight but reuses one input. A weight whose copies fit in the GPU's L2 together
(l2_cache.l2_bytes) is therefore read from L2 on every timed launch, and the fit of its `matmul@<n>x<k>`
shape takes that rate in (on the L40S, 96 MiB of L2, weights of 4-12 MiB stream at 1,060-1,350 GB/s at
m <= 8 against 660-720 GB/s past 16 MiB). In serving every other layer's weights and KV pass through L2
between two launches of a layer, so a weight comes from DRAM, as decode attention's KV does
(`decode_attention_l2`, aiconfigurator_tables.L2_BYTES).

The shape fits stay as they are (they reproduce the benchmark rows and their held-out errors). Serving
puts a floor under such a GEMM's memory side: its weight read takes at least what the calibration's DRAM
line gives, launch overhead plus bytes at a DRAM rate, fitted over the priced one-row times of the grid
shapes whose weights were not L2-resident (dram_line). A shape whose benchmark time is already slower
keeps its own; the activations (in L2 in both states: the benchmark reuses one input, serving reads what
the layer before just wrote) and the compute side stay at the shape's fit.

The same holds for the collector's per-tensor FP8 rows (modern_kernels.gemm_op: one byte a weight element,
`weight_bytes`) and for a GPU priced from derived defaults, whose shape keys are the calibrated GPUs'
benchmark fits: residency is judged on the L2 of the donor GPU the calibration records
(derived_defaults.gemm_benchmark_device), the line fitted over its own derived shapes.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .l2_cache import l2_bytes
from .roofline import Coeffs
from .roofline_fit import fit_family
from .shape_keys import _grid_lines, _shapes, matmul_key, on_matmul_grid

#: Copies of the weight AIConfigurator's GEMM collector cycles through in one CUDA graph (bf16 and
#: per-tensor FP8 rows; data/kernel_profiles README, `collector/vllm/collect_gemm.py`).
GEMM_WEIGHT_COPIES = 6
#: Bytes of one weight element in the bf16 GEMM tables the calibrations read. The per-tensor FP8 fits
#: (modern_fit) count bytes the same way (2 per element), but their weights hold 1 byte per element, so
#: their 6 copies fit in L2 up to twice the elements (`weight_bytes` below; modern_kernels.gemm_op).
WEIGHT_BYTES = 2


def weights_in_l2(device: str, n: float, k: float, dtype_bytes: float = WEIGHT_BYTES) -> bool:
    """Whether the benchmark's copies of an [n x k] weight fit in `device`'s L2 together (False where the
    L2 size is unknown)."""
    size = l2_bytes(device)
    return size is not None and GEMM_WEIGHT_COPIES * n * k * dtype_bytes <= size


def one_row_bytes(n: float, k: float, dtype_bytes: float = WEIGHT_BYTES) -> float:
    """Bytes of a one-row GEMM: the weight, one input row and one output row."""
    return dtype_bytes * (n * k + n + k)


def grid_shapes(coeffs: dict) -> dict[tuple[float, float], Coeffs]:
    """The `matmul@` shapes on the calibration's interpolation grid (AIConfigurator's GEMM table; a model
    layer's own shape from per-layer profiles, timed in a real forward pass, is no grid point)."""
    shapes = _shapes(coeffs, "matmul")
    ns, ks = _grid_lines(shapes)
    return {s: c for s, c in shapes.items() if s[0] in ns and s[1] in ks}


def dram_line(coeffs: dict, device: str, weight_bytes: float = WEIGHT_BYTES) -> Coeffs | None:
    """(overhead, seconds per byte) of a one-row GEMM whose weight comes from DRAM: fitted (relative error,
    robust) over the priced one-row times of the grid shapes whose weights (`weight_bytes` an element) were
    not L2-resident; None without such shapes or an L2 size. Bytes are counted as the fits count them
    (one_row_bytes)."""
    if l2_bytes(device) is None:
        return None
    points = [(one_row_bytes(n, k), c.time(0.0, one_row_bytes(n, k)))
              for (n, k), c in grid_shapes(coeffs).items() if not weights_in_l2(device, n, k, weight_bytes)]
    if len(points) < 2:
        return None
    nbytes, seconds = np.array(points).T
    return fit_family(np.zeros_like(nbytes), nbytes, seconds)


def weight_floor(coeffs: dict, device: str, n: float, k: float, c: Coeffs,
                 weight_bytes: float = WEIGHT_BYTES) -> tuple[float, float]:
    """(seconds per byte, extra seconds) of the memory floor that serving puts under an [n x k] GEMM priced
    at coefficients `c`: where the benchmark's copies of its weight fit in L2, a one-row launch reads it at
    least at the DRAM line (dtype bytes x (weight + one row in and out) x the line's seconds per byte, plus
    the line's overhead less `c`'s own); (0, 0) elsewhere, and for a model layer's own shape from per-layer
    profiles, timed in a real forward pass (operators.MatmulOp.time). `weight_bytes`: bytes of one weight
    element in the table `coeffs` was fitted to (1 for the per-tensor FP8 fits, modern_kernels.gemm_op)."""
    key = matmul_key(n, k)
    if not weights_in_l2(device, n, k, weight_bytes) or (key in coeffs and not on_matmul_grid(coeffs, key)):
        return 0.0, 0.0
    line = _line(device, weight_bytes, tuple((key, v) for key, v in coeffs.items() if key.startswith("matmul@")))
    return (0.0, 0.0) if line is None else (line.s_per_byte, line.overhead_s - c.overhead_s)


@lru_cache(maxsize=64)
def _line(device: str, weight_bytes: float, shapes: tuple) -> Coeffs | None:
    """dram_line of a calibration's `matmul@` coefficients (fitted once per table)."""
    return dram_line(dict(shapes), device, weight_bytes)
