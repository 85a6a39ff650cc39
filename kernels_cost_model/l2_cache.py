"""Elementwise launches as the GPU runs them: which find their data in L2 (two byte rates), and the
waves of token rows over the SMs.

An elementwise operator in a forward pass reads what the operator before it just wrote (SiLU-and-mul
reads the gate/up GEMM's output, a norm reads the residual add's). While that data fits in L2 the
operator streams it at L2 rates; beyond, at DRAM rates. LLMServingSim's vLLM 0.19 profiles show the
cliff: on the RTX PRO 6000 (128 MiB L2) `act_fn` of Llama-3.1-8B moves 4.1-4.7 TB/s up to 880 tokens
(76 MB) and 2.7 TB/s at 928 tokens (80 MB), 1.6-1.9 TB/s beyond 160 MB; on the RTX 4090 (72 MB L2) its
rate falls from 1.6-1.7 TB/s below 48 MB to 1.1-1.3 TB/s above 64 MB. Both cliffs sit at about 0.6 of
the L2 (the rest holds weights and the other tensors of the layer): `L2_RESIDENT_FRACTION`, read off
those two GPUs. A calibration fits each elementwise operator per tier (`elementwise.<op>@l2`,
`elementwise.<op>@dram`, shape_keys.py); GPUs with no documented L2 size have one tier. Past the
limit only the bytes beyond it are priced at the DRAM rate (`dram_bytes`): the first ones still hit L2,
so the rate keeps falling with size (RTX PRO 6000: 3.0 TB/s at 96 MB, 1.6 TB/s past 256 MB).

Waves: vLLM's norm and activation kernels run one thread block per token row, each block streaming its
row. A launch of m rows runs ceil(m / (SMs x rows per SM)) waves (`rows_per_sm`: one row per SM, or as
many RMSNorm blocks as fit, whose size vLLM sets from the width and the token count); while the rows are
few, a wave's time is one row's latency, not the bandwidth share of its bytes. `wave_bytes` is that
latency side, waves x row bytes, priced as the roofline's other side (s_per_flop x wave_bytes, the max
with the byte side): this is what makes wide rows (Qwen3-32B's 25600-wide SiLU) slower per byte than
narrow ones at the same token count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .aiconfigurator_tables import L2_BYTES, SYSTEMS
from .roofline import Coeffs

#: Share of the L2 an elementwise launch's bytes (read + written) may take and still run at L2 rates.
L2_RESIDENT_FRACTION = 0.6
#: L2 bytes per catalog GPU with the source of each figure (AIConfigurator systems' from L2_BYTES).
GPU_L2_BYTES: dict[str, tuple[int, str]] = {
    **{SYSTEMS[system]: size for system, size in L2_BYTES.items()},
    "rtx-4090": (72 * 2**20, "NVIDIA Ada Lovelace GPU Architecture whitepaper: GeForce RTX 4090, 72 MB L2"),
}

#: Streaming multiprocessors of the GPUs whose elementwise measurements are vLLM's own one-block-per-
#: token kernels (LLMServingSim's vLLM 0.19 profiles); datasheet figures. H100 and H200 are left out on
#: purpose: their elementwise rows are Inductor's compiled kernels (servesim's own measurement, vLLM's default
#: torch.compile path), which tile rows their own way.
SM_COUNT: dict[str, tuple[int, str]] = {
    "rtx-4090": (128, "NVIDIA Ada Lovelace GPU Architecture whitepaper: GeForce RTX 4090, 128 SMs"),
    "rtx-pro-6000": (188, "NVIDIA RTX PRO 6000 Blackwell datasheet: 24,064 CUDA cores = 188 SMs x 128"),
}


#: Threads an SM holds at once: 1536 on compute capability 8.9 (RTX 4090) and 12.0 (RTX PRO 6000)
#: (CUDA C++ Programming Guide, "Compute Capabilities" table: maximum resident threads per SM).
THREADS_PER_SM = 1536
#: vLLM's RMSNorm kernels (csrc/layernorm_kernels.cu) launch one block per token row, capped at 1024
#: threads below 256 tokens and at 256 from 256 tokens on ("smaller blocks to increase SM concurrency"):
#: `rms_norm` of min(hidden / 8, cap) threads (8 bf16 values per 16-byte vector), `fused_add_rms_norm`
#: of min(hidden, cap). From 256 tokens an SM runs 1536 / 256 = 6 rows at once; other elementwise
#: kernels run one row per SM.
NORM_OPERATORS = ("rms_norm", "add_rms_norm")
NORM_SMALL_BLOCKS_FROM_ROWS, NORM_BLOCK_CAP, NORM_BLOCK_CAP_MANY_ROWS = 256, 1024, 256
VECTOR_ELEMENTS = 8
#: Bytes of one activation value: bf16 in every catalog model (FP8 checkpoints keep bf16 activations).
ACTIVATION_BYTES = 2


def rows_per_sm(op: str, rows: float, width: float) -> int:
    """Token rows an SM runs at once in a one-block-per-row launch of `op` over `rows` rows of `width`."""
    if op not in NORM_OPERATORS:
        return 1
    cap = NORM_BLOCK_CAP_MANY_ROWS if rows >= NORM_SMALL_BLOCKS_FROM_ROWS else NORM_BLOCK_CAP
    block = min(cap, max(width // VECTOR_ELEMENTS, 32) if op == "rms_norm" else width)
    return max(THREADS_PER_SM // int(block), 1)


def waves(sms: float, op: str, rows: float, row_bytes: float) -> float:
    """Waves of a one-block-per-row launch on `sms` SMs: ceil(rows / (SMs x rows per SM)); 0 if SMs unknown."""
    if not sms:
        return 0.0
    return math.ceil(rows / (sms * rows_per_sm(op, rows, row_bytes / ACTIVATION_BYTES)))


def sm_count(gpu: str) -> float | None:
    found = SM_COUNT.get(gpu.split("@", 1)[0])
    return None if found is None else float(found[0])


def wave_bytes(gpu: str, rows: float, row_bytes: float, op: str = "") -> float:
    """Latency side of a one-block-per-row launch of `op`: waves x row bytes (0 if SMs unknown)."""
    return waves(sm_count(gpu) or 0.0, op, rows, row_bytes) * row_bytes


def dram_bytes(gpu: str, nbytes: float) -> float:
    """Bytes of a DRAM-tier launch priced at its DRAM rate: those beyond the L2-resident limit."""
    size = l2_bytes(gpu)
    return nbytes if size is None else max(nbytes - L2_RESIDENT_FRACTION * size, 0.0)


def l2_bytes(gpu: str) -> float | None:
    """The L2 size of a catalog GPU (a calibration name `gpu@tag` counts as its GPU), or None."""
    found = GPU_L2_BYTES.get(gpu.split("@", 1)[0])
    return None if found is None else float(found[0])


def elementwise_tier(gpu: str, nbytes: float) -> str | None:
    """"l2" or "dram" for an elementwise launch moving `nbytes`; None where the L2 size is unknown."""
    size = l2_bytes(gpu)
    if size is None:
        return None
    return "l2" if nbytes <= L2_RESIDENT_FRACTION * size else "dram"


@dataclass(frozen=True, slots=True)
class ElementwiseOp:
    """One elementwise operator of a step: its operator-level coefficients (`base`: bytes and launch
    overhead only, over launches of every size) and, where fitted, one set per L2 tier. cost() picks the tier by the
    launch's bytes; past the limit it never prices below the L2 tier, so more bytes never cost less. An
    operator measured only within the limit (RMSNorm, RoPE and the embedding in LLMServingSim's profiles)
    keeps its L2 tier there and, past it, the operator-level streaming rate."""

    base: Coeffs
    l2: Coeffs | None = None
    dram: Coeffs | None = None
    l2_limit: float = 0.0
    sms: float = 0.0
    op: str = ""

    @property
    def s_per_byte(self) -> float:
        return self.base.s_per_byte

    @property
    def overhead_s(self) -> float:
        return self.base.overhead_s

    def cost(self, nbytes: float, rows: float, row_bytes: float) -> float:
        """Seconds for one launch moving `nbytes` over `rows` token rows of `row_bytes` each."""
        side = waves(self.sms, self.op, rows, row_bytes) * row_bytes
        if self.l2 is None:
            return _launch(self.base, nbytes, rows, side)
        near = _launch(self.l2, nbytes, rows, side)
        if nbytes <= self.l2_limit:
            return near
        if self.dram is None:  # nothing measured past the limit: the operator's streaming rate there
            return max(near, _launch(self.base, nbytes, rows, 0.0))
        return max(near, _launch(self.dram, nbytes - self.l2_limit, rows, side))


    def launches(self, count: int, nbytes: float) -> float:
        """Seconds for `count` launches sharing `nbytes` outside a layer's token rows (the sampler over
        the logits, the MoE permutes): each launch at its tier by its share, no row terms; a launch past
        the L2 limit streams at the DRAM tier's rate, not the operator's mostly-in-L2 fit."""
        return count * self.cost(nbytes / count, 0.0, 0.0) if count else 0.0


def _launch(c: Coeffs, nbytes: float, rows: float, wave_side: float) -> float:
    side = max(nbytes * c.s_per_byte, wave_side * c.s_per_flop)
    return side + c.overhead_s + rows * c.s_per_seq


def elementwise_op(coeffs: dict, gpu: str, op: str) -> ElementwiseOp:
    """The elementwise operator `op` of a calibration's coefficients on catalog GPU `gpu`."""
    base = coeffs.get(f"elementwise.{op}") or coeffs["elementwise"]
    size, sms = l2_bytes(gpu), sm_count(gpu) or 0.0
    l2, dram = coeffs.get(f"elementwise.{op}@l2"), coeffs.get(f"elementwise.{op}@dram")
    if size is None or l2 is None:
        return ElementwiseOp(base, sms=sms, op=op)
    return ElementwiseOp(base, l2, dram, L2_RESIDENT_FRACTION * size, sms, op)
