"""Prices MLA attention, FP8 GEMMs and quantised MoE layers from the measured fits of modern_fit.py.

`data/calibration_modern/<gpu>.json` holds, per GPU, roofline coefficients fitted to AIConfigurator's
vLLM tables (see that file's `sources` and `holdout_error`). layer_ops.py asks here for:
- `gemm_op(gpu, variant, like)`: a weight matmul at the measured FP8 ("fp8" per-tensor, "fp8_block")
  coefficients of its (n, k), interpolated between grid shapes (shape_keys.matmul_coeffs);
- `moe_op(gpu, variant, hidden, inter, experts, top_k)`: vLLM's FusedMoE at the weight dtype's fit;
- `mla_kernels(gpu, spec, heads, kv_dtype, gemm)`: the MLA module (or, on a100, kernel) fits of this
  head count, as an `MLAKernels` that prices a batch's prefill and decode rows;
- `gdn_kernels(gpu, spec, tp)`: the Gated DeltaNet (linear-attention) layer fits, as `GDNKernels`.
Each returns None where no fit exists; the caller keeps its roofline estimate.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import mla
from .l2_cache import l2_bytes
from .operators import FusedMoE, MatmulOp
from .roofline import Coeffs
from .shape_keys import _num, matmul_coeffs, moe_coeffs
from .weights_l2 import weight_floor

DATA_DIR = Path(__file__).parent / "data" / "calibration_modern"
_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0}
#: GEMM variant -> the fit that prices it (see gemm_op).
GRAPHED_GEMM = {"fp8_block": "fp8"}


@lru_cache(maxsize=None)
def load_modern(gpu_name: str) -> dict | None:
    """The shipped fits of a GPU as {kind: {variant: {key: Coeffs}}, "_raw": json}, or None."""
    path = DATA_DIR / f"{gpu_name}.json"
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    fits = {kind: {variant: {k: Coeffs(**c) for k, c in fit["coeffs"].items()}
                   for variant, fit in raw.get(kind, {}).items()} for kind in ("mla", "gemm", "moe", "gdn")}
    scopes = {variant: fit["scope"] for variant, fit in raw["mla"].items()}
    row_steps = {variant: float(fit.get("row_step", 0)) for variant, fit in raw.get("gemm", {}).items()}
    return {**fits, "scope": scopes, "row_step": row_steps, "_raw": raw}


def weight_variant(spec) -> str:
    """The GEMM/MoE table dtype of a model's weights: fp8_block, fp8, w4a16_mxfp4 or bfloat16."""
    if spec.quant_method == "fp8":
        return "fp8_block" if spec.weight_block_size else "fp8"
    return "w4a16_mxfp4" if spec.quant_method == "mxfp4" else "bfloat16"


def gemm_op(gpu_name: str, variant: str, like: MatmulOp, n: float, k: float) -> MatmulOp | None:
    """`like` (a bf16 MatmulOp of weight [k x n]) at the measured coefficients of an FP8 variant.

    Block-scaled ("fp8_block") weights are priced at the per-tensor "fp8" fit: the fp8_block rows were
    timed eagerly, without a CUDA graph (kernel_profiles README), so at small batches they hold ~50 us of
    launch latency per GEMM that vLLM's graphs remove (h200, n=512, k=7168, m=1: 59 us eager against
    10 us graph-captured fp8); modern_fit does not fit them. The kernel computes its rows padded to its
    M tile (the fit's `row_step`, operators.padded_rows). A shape whose 6 FP8 weight copies sat in L2 in the
    benchmark reads its weight at least at the FP8 table's DRAM line in serving (weights_l2.weight_floor).
    One roofline per shape: the FP8 fits have no two regimes (matmul_regimes.py is the bf16 tables').
    """
    fits = load_modern(gpu_name)
    fitted = GRAPHED_GEMM.get(variant, variant)
    table = fits and fits["gemm"].get(fitted)
    if not table:
        return None
    shaped = matmul_coeffs(table, n, k)
    c = shaped or table["matmul"]
    floor = weight_floor(table, gpu_name, n, k, c, _BYTES[fitted]) if shaped else (0.0, 0.0)
    return MatmulOp(like.weight, like.width, c.s_per_flop, c.s_per_byte, c.overhead_s, c.tile_rows,
                    fits["row_step"][fitted], *floor)


def moe_op(gpu_name: str, variant: str, hidden: float, inter: float, experts: float, top_k: float) -> FusedMoE | None:
    """vLLM's FusedMoE on one GPU at the fit of its weight dtype (per shape where fitted)."""
    fits = load_modern(gpu_name)
    table = fits and fits["moe"].get(variant)
    if not table:
        return None
    return FusedMoE(hidden, inter, moe_coeffs(table, hidden, inter, experts, top_k) or table["moe"])


def _nearest_heads(table: dict[str, Coeffs], heads: float) -> Coeffs:
    shapes = {float(k.split("@", 1)[1]): c for k, c in table.items() if "@" in k}
    if not shapes:
        return table["mla"]
    return shapes[min(shapes, key=lambda h: (abs(math.log(h / heads)), h))]


@dataclass(frozen=True)
class MLAKernels:
    """One MLA layer's measured cost on one GPU: context (prefill) and generation (decode) fits;
    `l2_bytes` of the GPU (a module's prefill pays its hidden states beyond it, mla.context_spilled_bytes)."""

    spec: object
    heads: float
    context: Coeffs
    generation: Coeffs
    kv_bytes: float
    weight_bytes: float
    scope: str              # "module": projections included; "kernel": attention alone
    l2_bytes: float = 0.0

    def prefill(self, tokens: float, pairs: float, cached: float, seqs: int) -> float:
        """Seconds for `seqs` prefill rows of `tokens` new tokens in all."""
        if seqs <= 0:
            return 0.0
        f, b, a = mla.split_context(self.spec, self.heads, tokens, pairs, cached, self.kv_bytes,
                                    self.weight_bytes, self.scope)
        if not self.context.s_per_attention_flop:  # (a fit with one rate for both)
            f, a = f + a, 0.0
        spilled = mla.context_spilled_bytes(self.spec, tokens, self.l2_bytes, self.scope)
        return self.context.time(f, b, max(tokens / seqs, 1.0), seqs, side=(0.0, 0.0, 0.0, spilled),
                                 attention_flops=a)

    def decode(self, rows: int, keys: float, read_weights: bool = True) -> float:
        """Seconds for `rows` decode rows reading `keys` cached keys in all (without the module's
        weight reads when `read_weights` is False: a prefill in the same step read them)."""
        if rows <= 0:
            return 0.0
        f, b = mla.generation_cost(self.spec, self.heads, rows, keys, self.kv_bytes, self.weight_bytes, self.scope,
                                   read_weights)
        return self.generation.time(f, b, float(rows), rows)


def mla_kernels(gpu_name: str, spec, heads: float, kv_cache_dtype: str = "auto") -> MLAKernels | None:
    """The MLA fits for a GPU holding `heads` query heads, at the model's weight and KV dtypes."""
    fits = load_modern(gpu_name)
    if not fits or not spec.is_mla:
        return None
    kv = "fp8" if kv_cache_dtype == "fp8" else "bfloat16"
    gemm = "fp8_block" if weight_variant(spec) in ("fp8", "fp8_block") else "bfloat16"
    for g in (gemm, "bfloat16"):  # a100 measured the bf16 kernel only
        ctx, gen = fits["mla"].get(f"context/{kv}/{g}"), fits["mla"].get(f"generation/{kv}/{g}")
        if ctx and gen:
            scope = fits["scope"][f"generation/{kv}/{g}"]
            return MLAKernels(spec, heads, _nearest_heads(ctx, heads), _nearest_heads(gen, heads),
                              _BYTES[kv], _BYTES[g], scope, l2_bytes(gpu_name) or 0.0)
    return None


#: Bytes per recurrent-state element in AIConfigurator's GDN tables (fp32 state), which the fits use.
GDN_STATE_BYTES = 4.0
#: Tokens per chunk of vLLM's chunked delta rule (`chunk_gated_delta_rule`, flash-linear-attention's
#: kernels as vLLM vendors them in model_executor/layers/fla/ops: chunk_size 64 throughout).
GDN_CHUNK = 64


def gdn_cost(tokens: float, seqs: float, k_heads: float, k_dim: float, v_heads: float, v_dim: float,
             state_bytes: float = GDN_STATE_BYTES) -> tuple[float, float]:
    """(FLOPs, bytes) of one GDN layer: the delta rule's ~6 FLOPs per state element per token; each
    sequence's state read and written once at `state_bytes` per element, and q, k, v, output (bf16)
    per token."""
    state = v_heads * k_dim * v_dim
    flops = 6.0 * state * tokens
    nbytes = 2.0 * state_bytes * state * seqs + 2.0 * tokens * (2 * k_heads * k_dim + 2 * v_heads * v_dim)
    return flops, nbytes


def gdn_chunks(tokens: float) -> float:
    """Chunks one sequence's `tokens` take in the chunked delta rule."""
    return float(math.ceil(tokens / GDN_CHUNK))


def gdn_intermediate_bytes(tokens: float, chunks: float, k_dim: float, v_heads: float, v_dim: float) -> float:
    """Bytes the chunked delta rule's kernels write for the next one to read, over `tokens` in `chunks`
    chunks (all sequences): per token and value head the chunk's fp32 K K^T row and its bf16 inverse
    (`chunk_scaled_dot_kkt_fwd`, `solve_tril`), w, u and the new values (bf16: `recompute_w_u_fwd`,
    `chunk_gated_delta_rule_fwd_h`), and per chunk and value head the bf16 state `chunk_fwd_o` reads."""
    per_token = (4 + 2) * GDN_CHUNK + 2 * k_dim + 2 * v_dim + 2 * v_dim
    return v_heads * (tokens * per_token + chunks * 2.0 * k_dim * v_dim)


def gdn_chunk_rows(lengths) -> float:
    """Rows of the fullest chunk of a prefill launch over sequences of `lengths` tokens (at most
    GDN_CHUNK), which its chunk-local kernels walk one row after another.

    Every chunk of every sequence runs at once, but inside a chunk the delta rule's triangular solve
    takes the rows in order, so a launch waits for its fullest chunk's rows. AIConfigurator's GDN tables
    show it at small batches, where nothing else fills the GPU: on L40S (2 key / 4 value heads) one
    sequence takes 19 us at 1 token, 23 at 16, 26 at 32, 31 at 64 (batch 1-8 alike), then 32 us at 128
    tokens, two full chunks. With this term the held-out median of every GPU's context fit falls (L40S
    6.6 -> 4.3 %, RTX PRO 6000 5.4 -> 3.7 %, H100 5.1 -> 4.5 %); counting rows of 16 instead of 64
    (a solve in 16-row blocks) left L40S at 5.9 %."""
    return float(min(max(lengths, default=0.0), GDN_CHUNK))


def gdn_prefill_terms(lengths, k_dim: float, v_heads: float, v_dim: float, l2_bytes: float) -> tuple[float, float]:
    """(critical-path chunks, bytes spilled beyond L2) of a prefill launch over sequences of `lengths`
    tokens. `chunk_gated_delta_rule_fwd_h` walks each sequence's chunks one after another (its grid is
    value blocks x sequences x heads), so the longest sequence's chunks are a serial path; intermediates
    beyond the L2 go to DRAM and back."""
    chunks = [gdn_chunks(n) for n in lengths]
    inter = gdn_intermediate_bytes(float(sum(lengths)), float(sum(chunks)), k_dim, v_heads, v_dim)
    return max(chunks, default=0.0), max(inter - l2_bytes, 0.0)


@dataclass(frozen=True)
class GDNKernels:
    """One Gated DeltaNet layer on one GPU (conv1d + delta rule), at the measured fits, with the
    recurrent state at the bytes per element vLLM keeps it in for this model; `l2_bytes` of the GPU
    (the prefill fit prices intermediates beyond it)."""

    heads: tuple            # (key heads, key dim, value heads, value dim) on this GPU
    context: Coeffs
    generation: Coeffs
    state_bytes: float = GDN_STATE_BYTES
    l2_bytes: float = 0.0

    def prefill(self, lengths) -> float:
        """One launch over prefill rows of `lengths` new tokens each."""
        if not lengths:
            return 0.0
        tokens, seqs = float(sum(lengths)), len(lengths)
        f, b = gdn_cost(tokens, seqs, *self.heads, self.state_bytes)
        path, spilled = gdn_prefill_terms(lengths, self.heads[1], self.heads[2], self.heads[3], self.l2_bytes)
        return self.context.time(f, b, max(tokens / seqs, 1.0), seqs, path, (0.0, 0.0, 0.0, spilled),
                                 chunk_rows=gdn_chunk_rows(lengths))

    def decode(self, rows: int) -> float:
        if rows <= 0:
            return 0.0
        f, b = gdn_cost(rows, rows, *self.heads, self.state_bytes)
        return self.generation.time(f, b, 1.0, rows)


def gdn_kernels(gpu_name: str, spec, tp: int) -> GDNKernels | None:
    """The GDN fits for `spec`'s linear-attention layers at tp ranks (value/key heads split tp ways)."""
    fits = load_modern(gpu_name)
    if not fits or not fits["gdn"].get("context") or not fits["gdn"].get("generation"):
        return None
    hk, hv = max(spec.linear_num_key_heads // tp, 1), max(spec.linear_num_value_heads // tp, 1)
    key = f"gdn@{_num(hk)}/{_num(hv)}"

    def pick(table: dict) -> Coeffs:
        if key in table:
            return table[key]
        shapes = {tuple(float(x) for x in k.split("@")[1].split("/")): c for k, c in table.items() if "@" in k}
        near = min(shapes, key=lambda s: (abs(math.log(s[1] / hv)) + abs(math.log(s[0] / hk)), s), default=None)
        return shapes[near] if near else table["gdn"]

    return GDNKernels((hk, spec.linear_key_head_dim, hv, spec.linear_value_head_dim),
                      pick(fits["gdn"]["context"]), pick(fits["gdn"]["generation"]),
                      float(spec.ssm_state_dtype_bytes or spec.dtype_bytes), l2_bytes(gpu_name) or 0.0)
