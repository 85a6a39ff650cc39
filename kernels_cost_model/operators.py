"""The priced operators of one model on one GPU, each with the calibration's coefficients for its shape.

`make_cost_model` builds these once: a `MatmulOp` per weight (coefficients of its (n, k) shape, else of
its operator, else of the matmul family), the attention coefficients of the head layout on one GPU, a
fused MoE operator where the calibration measured one, and the all-reduce curve of the group size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .calibration import Calibration
from .collectives import CollectiveCurve, collective_curve
from .roofline import Coeffs, experts_hit
from .matmul_regimes import Regimes
from .shape_keys import attention_coeffs, matmul_coeffs, matmul_key, moe_coeffs
from .derived_defaults import GEMM_BENCHMARK_KEY
from .weights_l2 import weight_floor


@dataclass(frozen=True, slots=True)
class MatmulOp:
    """One weight matmul on one GPU: [rows x k] @ [k x n]; weight = k*n elements."""

    weight: float
    width: float          # k + n: activation elements read and written per row
    s_per_flop: float
    s_per_byte: float
    overhead_s: float
    tile_rows: float
    row_step: float = 0.0  # the kernel computes padded_rows(rows, row_step) rows (0: the rows given)
    #: The weight read from DRAM where the shape's fit saw it in L2 (weights_l2.weight_floor): the memory
    #: side takes at least dtype bytes x (weight + width) x dram_s_per_byte + dram_extra_s (0: no floor).
    dram_s_per_byte: float = 0.0
    dram_extra_s: float = 0.0
    #: The shape's two regimes where its calibration split it (matmul_regimes.py): they price its rows in
    #: place of the one-regime coefficients above, the L2 weight floor on both.
    regimes: Regimes | None = None

    def time(self, rows: float, dtype_bytes: float) -> float:
        g = self.regimes
        if g is None:
            return self._roofline(rows, dtype_bytes, self.s_per_flop, self.s_per_byte, self.overhead_s,
                                  self.tile_rows, self.dram_extra_s)
        low = self._regime(rows, dtype_bytes, g.low) if rows < g.above else 0.0
        high = self._regime(rows, dtype_bytes, g.high) if rows > g.below else 0.0
        return g.time(low, high, rows)

    def _regime(self, rows: float, dtype_bytes: float, c: Coeffs) -> float:
        """Seconds at one regime's coefficients; the weight floor still ends at the DRAM line's time (its
        extra seconds are set against the one-regime overhead, weights_l2.weight_floor)."""
        extra = self.dram_extra_s + self.overhead_s - c.overhead_s if self.dram_s_per_byte else 0.0
        return self._roofline(rows, dtype_bytes, c.s_per_flop, c.s_per_byte, c.overhead_s, c.tile_rows, extra)

    def grouped(self, rows: float, dtype_bytes: float, groups: float) -> float:
        """Seconds of one grouped launch over `groups` weights of this shape, `rows` rows each: the work
        of each, one launch overhead (of the regime of `rows`)."""
        g = self.regimes
        overhead = self.overhead_s if g is None else g.time(g.low.overhead_s, g.high.overhead_s, rows)
        return (self.time(rows, dtype_bytes) - overhead) * groups + overhead

    def _roofline(self, rows: float, dtype_bytes: float, s_per_flop: float, s_per_byte: float,
                  overhead_s: float, tile_rows: float, dram_extra_s: float) -> float:
        computed = padded_rows(rows, self.row_step) if self.row_step else rows
        compute = 2.0 * computed * self.weight * s_per_flop * (1.0 + tile_rows / computed)
        memory = dtype_bytes * (rows * self.width + self.weight) * s_per_byte
        if self.dram_s_per_byte:
            weight_read = dtype_bytes * (self.width + self.weight) * self.dram_s_per_byte + dram_extra_s
            memory = max(memory, weight_read)
        return (compute if compute > memory else memory) + overhead_s

    def scaled(self, flop: float, byte: float) -> "MatmulOp":
        """The operator with its seconds per FLOP and per byte (both regimes, the DRAM floor) scaled."""
        return replace(self, s_per_flop=self.s_per_flop * flop, s_per_byte=self.s_per_byte * byte,
                       dram_s_per_byte=self.dram_s_per_byte * byte,
                       regimes=self.regimes and self.regimes.scaled(flop, byte))

    def like(self, k: float, n: float) -> "MatmulOp":
        """A weight [k x n] at this operator's one-regime coefficients (its regimes are its shape's own)."""
        return replace(self, weight=k * n, width=k + n, regimes=None)


#: The smallest M tile of vLLM's CUTLASS scaled-mm dispatch (its kernel for batches of up to 16 rows).
MIN_ROW_TILE = 16


def padded_rows(rows: float, step: float) -> float:
    """Rows a GEMM whose kernel pads the token dimension to its M tile computes for `rows` rows.

    vLLM's CUTLASS scaled-mm (FP8) dispatch picks a kernel by batch size: small batches go to kernels
    whose M tile is the next power of two from 16, up to `step`, and larger ones to a `step`-row tile,
    so 257 rows cost as much compute as 512 at step 256. `step` is per GPU (modern_fit.ROW_STEPS)."""
    if rows <= step:
        return float(max(MIN_ROW_TILE, 2 ** math.ceil(math.log2(rows)))) if rows > 0 else rows
    return math.ceil(rows / step) * step


def matmul_operator(cal: Calibration, op: str, k: float, n: float) -> MatmulOp:
    """The `MatmulOp` of weight [k x n], priced at its shape's coefficients where calibrated (a shape
    whose benchmark weights sat in L2 reads them at least at the DRAM line in serving, weights_l2.py)."""
    shaped = matmul_coeffs(cal.coeffs, n, k)
    c = shaped or cal.coeffs.get(f"matmul.{op}") or cal.coeffs["matmul"]
    bench = cal.provenance.get(GEMM_BENCHMARK_KEY, cal.device)  # a derived calibration: its donors' benchmark
    floor = weight_floor(cal.coeffs, bench, n, k, c) if shaped and bench else (0.0, 0.0)
    regimes = cal.regimes.get(matmul_key(n, k)) if shaped else None
    return MatmulOp(k * n, k + n, c.s_per_flop, c.s_per_byte, c.overhead_s, c.tile_rows, 0.0, *floor, regimes)


def attention_operator(cal: Calibration, family: str, heads: float, kv_heads: float, head_dim: float) -> Coeffs:
    """Coefficients of an attention launch with this head layout on one GPU."""
    return attention_coeffs(cal.coeffs, family, heads, kv_heads, head_dim) or cal.coeffs[family]


@dataclass(frozen=True, slots=True)
class FusedMoE:
    """vLLM's FusedMoE layer on one GPU, priced as one measured operator (roofline.moe): the grouped
    GEMMs' roofline, plus its per-routed-row kernels (block alignment and sort, activation, the weighted
    sum of the experts' outputs) at `s_per_seq` a row (roofline.operator_seqs)."""

    hidden: float
    inter: float          # per expert, on this GPU
    coeffs: Coeffs

    def time(self, tokens: float, experts: float, top_k: float, dtype_bytes: float) -> float:
        """Seconds for `tokens` tokens over `experts` experts on this GPU, `top_k` of them per token."""
        c, h, i = self.coeffs, self.hidden, self.inter
        active = experts_hit(tokens, experts, top_k)
        rows = tokens * top_k
        flops = 6.0 * rows * h * i
        nbytes = dtype_bytes * (active * 3.0 * h * i + 2.0 * tokens * h + 3.0 * rows * i)
        compute = flops * c.s_per_flop * (1.0 + c.tile_rows * active / rows)
        memory = nbytes * c.s_per_byte
        return (compute if compute > memory else memory) + c.overhead_s + rows * c.s_per_seq


def moe_operator(cal: Calibration, hidden: float, inter: float, experts: float, top_k: float) -> FusedMoE | None:
    """The fused MoE operator where the calibration measured MoE layers, else None (grouped matmuls)."""
    if "moe" not in cal.coeffs:
        return None
    return FusedMoE(hidden, inter, moe_coeffs(cal.coeffs, hidden, inter, experts, top_k) or cal.coeffs["moe"])


def all_reduce_curve(cal: Calibration, gpu_name: str, tp: int, collective: str = "all_reduce") -> CollectiveCurve | None:
    """The measured curve for `tp` ranks: a host's own sweep in data/collective_curves.csv where one is
    catalogued (it names the transport that host runs, e.g. NCCL over PCIe on RTX PRO 6000 with vLLM
    0.19, whose custom all-reduce does not run on sm_12x), else the calibration's (vLLM's all-reduce as
    AIConfigurator measured it on that GPU's system), else None."""
    if tp <= 1:
        return None
    catalogued = collective_curve(gpu_name, tp, collective)
    if catalogued is not None:
        return catalogued
    points = cal.curves.get(f"{collective}@{tp}")
    return CollectiveCurve.from_points(points) if points else None
