"""Operators of the shapes beyond plain attention, priced per layer type around the roofline model.

`shaped_cost_model(base)` wraps a RooflineCostModel built for a non-plain ModelSpec and prices:
- weights at their stored precision: FP8 GEMMs at the GPU's FP8 peak (gpus.csv) reading one byte per
  weight; MXFP4 experts reading 4.25 bits per weight (compute stays at the BF16 peak: vLLM's
  Hopper MXFP4 path dequantises to BF16);
- MLA (DeepSeek-V3): low-rank q/kv projections; decode attention absorbed (every head reads the shared
  576-wide latent, 2 x (576 + 512) FLOPs per key and head), prefill not absorbed (K/V expanded per
  head: 2 x (192 + 128) FLOPs per key and head), as vLLM's MLA backends run them;
- sliding-window and chunked layers: the same attention kernel over keys bounded by the window
  (or by the current chunk);
- linear-attention (Gated DeltaNet) layers: per token, the recurrent update (value heads x key_dim x
  value_dim state, ~6 FLOPs per element), and per request a read and write of its state;
- MoE shared experts (a dense MLP beside the routed ones) and leading dense layers (DeepSeek's
  first_k_dense_replace). Expert parallelism: see expert_sharding.py.
Where modern_fit.py measured them for this GPU (modern_kernels.py), FP8 GEMMs, FusedMoE at the weights'
dtype, the MLA layer (module fit: projections included, reported under attention) and the Gated
DeltaNet layer use those fits.
Returns seconds in the base model's BREAKDOWN_KEYS order; calibration coefficients are the base's.
"""
from __future__ import annotations

import dataclasses

from kernels_cost_model.batch import BatchShape

from .kv_layout import linear_state_bytes
from .model_shapes import CHUNKED, FULL, LINEAR, SLIDING, attention_params
from .modern_kernels import gdn_kernels, gemm_op, mla_kernels, moe_op, weight_variant
#: FLOPs per state element per token of the gated delta rule (decay, k^T S, rank-1 update, q S).
DELTA_RULE_FLOPS_PER_ELEMENT = 6.0


def _precision_matmuls(base, spec, measured: bool) -> dict:
    """qkv/o/up/down/router/lm_head at the weights' stored precision."""
    d = float(spec.dtype_bytes)
    dense_b = spec.weight_bytes or d
    expert_b = spec.expert_weight_bytes or dense_b
    fp8_speed = (base.gpu.bf16_flops_per_s / base.gpu.fp8_flops_per_s
                 if spec.quant_method == "fp8" and base.gpu.fp8_flops_per_s else 1.0)
    out = {name: getattr(base, name).scaled(fp8_speed, dense_b / d) for name in ("qkv", "o")}
    moe_b = expert_b if base.router is not None else dense_b
    out.update({name: getattr(base, name).scaled(fp8_speed, moe_b / d) for name in ("up", "down")})
    variant, gpu = weight_variant(spec), base.gpu.name
    if not measured:
        return out
    shapes = {"qkv": (base.hidden, base.q_gpu + 2 * base.kv_gpu), "o": (base.q_gpu, base.hidden),
              "up": (base.hidden, 2 * base.inter_gpu), "down": (base.inter_gpu, base.hidden)}
    if variant.startswith("fp8"):  # measured FP8 GEMMs of this shape where modern_fit has them
        for name, (k, n) in shapes.items():
            out[name] = gemm_op(gpu, variant, getattr(base, name), n, k) or out[name]
    if base.router is not None and variant != "bfloat16":
        moe = moe_op(gpu, variant, base.hidden, base.inter_gpu, base.experts, base.top_k)
        if moe is not None:
            out["fused_moe"] = moe
    return out


def _mla_fields(spec, tp: int, qkv, o) -> tuple[dict, dict]:
    """(decode fields: absorbed, prefill fields: expanded) for the attention kernel, plus MLA matmuls."""
    h = spec.hidden_size
    heads = spec.num_heads / tp
    latent = spec.kv_lora_rank + spec.qk_rope_head_dim
    o_params = spec.num_heads * spec.v_head_dim * h
    proj = qkv.like(h, (attention_params(spec) - o_params) / tp / h)
    o = o.like(spec.num_heads * spec.v_head_dim / tp, h)
    decode = dict(kv_gpu=latent / 2.0, heads_gpu_x_hd=heads * (latent + spec.kv_lora_rank) / 2.0,
                  q_gpu=heads * latent, qkv=proj, o=o)
    prefill = dict(decode, kv_gpu=heads * (spec.head_dim + spec.v_head_dim) / 2.0,
                   heads_gpu_x_hd=heads * (spec.head_dim + spec.v_head_dim) / 2.0)
    return decode, prefill


@dataclasses.dataclass(frozen=True)
class ShapedCostModel:
    """Step time of a model whose layers are not all plain attention; same API as RooflineCostModel."""

    keys: tuple               # the base's BREAKDOWN_KEYS
    base: object              # RooflineCostModel at the stored precision (decode-path MLA fields)
    prefill_base: object      # same, with MLA's prefill (non-absorbed) attention fields
    counts: dict              # layer kind -> layers
    window: int
    linear_state_bytes: float
    linear_flops_per_token: float
    moe_layers: int
    dense_mlp: tuple          # (up, down) of the leading dense layers, or ()
    shared_mlp: tuple         # (up, down) of the shared experts, or ()
    mla: object = None        # modern_kernels.MLAKernels where measured, else None (roofline MLA)
    gdn: object = None        # modern_kernels.GDNKernels where measured, else None (roofline delta rule)

    @property
    def model(self):
        return self.base.model

    @property
    def gpu(self):
        return self.base.gpu

    @property
    def tensor_parallel_size(self):
        return self.base.tensor_parallel_size

    def step_time(self, batch: BatchShape) -> float:
        return sum(self._terms(batch))

    def breakdown(self, batch: BatchShape, pad_to: int = 0) -> dict[str, float]:
        """Seconds per operator family (`pad_to`: as RooflineCostModel.breakdown's)."""
        return dict(zip(self.keys, self._terms(batch, pad_to)))

    def layer_seconds(self, batch: BatchShape):
        """The batch's seconds by layer class, for pipeline stages (stage_times.py)."""
        from .stage_times import shaped_layer_seconds
        return shaped_layer_seconds(self, batch)

    def attention_by_kind(self, batch: BatchShape, pad_to: int = 0) -> dict[str, float]:
        """Attention seconds of all layers of each kind (unmeasured MLA: as `_terms` prices them)."""
        return {kind: pf + dec for kind, (pf, dec) in self._kind_attention(batch, pad_to).items()}

    def dense_mlp_s(self, batch: BatchShape) -> float:
        """One leading dense layer's MLP in a MoE model (0 where there is none)."""
        t = float(sum(batch.num_new_tokens))
        if t <= 0 or not self.moe_layers or not self.dense_mlp:
            return 0.0
        up, down = self.dense_mlp
        return up.time(t, self.base.dtype_bytes) + down.time(t, self.base.dtype_bytes)

    def _terms(self, batch: BatchShape, pad_to: int = 0) -> list[float]:
        terms = list(self.base._terms(batch, pad_to=pad_to))
        at_pf, at_dec, at_mlp = (self.keys.index(k) for k in ("prefill_attention", "decode_attention", "mlp"))
        attn = [0.0, 0.0]
        for kind, (pf, dec) in self._kind_attention(batch, pad_to, terms).items():
            if kind != LINEAR:
                attn[0] += pf
            attn[1] += dec
        terms[at_pf], terms[at_dec] = attn
        full = self.counts.get(FULL, 0)
        if self.mla is not None and full:
            self._measured_mla(batch, terms, full)
        terms[at_mlp] = self._mlp(batch, terms[at_mlp], pad_to)
        return terms

    def _kind_attention(self, batch: BatchShape, pad_to: int = 0, terms=None) -> dict[str, tuple[float, float]]:
        """(prefill, decode) attention seconds of all layers of each kind, in pricing order; `terms`:
        the base's terms of the batch, if at hand."""
        at_pf, at_dec = self.keys.index("prefill_attention"), self.keys.index("decode_attention")
        terms = terms if terms is not None else self.base._terms(batch, pad_to=pad_to)
        L, out = self.base.layers, {}
        full = self.counts.get(FULL, 0)
        if full:
            pf = self.prefill_base._terms(batch, pad_to=pad_to) if self.prefill_base is not self.base else terms
            out[FULL] = (pf[at_pf] / L * full, terms[at_dec] / L * full)
        for kind in (SLIDING, CHUNKED):
            if self.counts.get(kind):
                capped = self.base._terms(_bounded(batch, kind, self.window), pad_to=pad_to)
                out[kind] = (capped[at_pf] / L * self.counts[kind], capped[at_dec] / L * self.counts[kind])
        if self.counts.get(LINEAR):
            out[LINEAR] = (0.0, self.counts[LINEAR] * self._linear(batch))
        return out

    def _measured_mla(self, batch: BatchShape, terms: list, layers: int) -> None:
        """MLA layers at the measured fits: prefill rows at the context fit, decode rows at the generation
        one (the smaller fixed cost counted once when both run, and the module's weights read once: by
        the prefill side); a module fit includes the projections, so qkv/o move into the attention terms."""
        tok = pairs = cached = keys = 0.0
        n_pf = n_dec = 0
        for n, c in zip(batch.num_new_tokens, batch.num_context_tokens):
            if n == 1:
                n_dec, keys = n_dec + 1, keys + c + 1
            elif n > 1:
                n_pf, tok, pairs, cached = n_pf + 1, tok + n, pairs + n * c + n * (n + 1) / 2, cached + c
        k = self.keys.index
        pf, dec = self.mla.prefill(tok, pairs, cached, n_pf), self.mla.decode(n_dec, keys, read_weights=not n_pf)
        if pf and dec:  # one forward pass: the module's fixed launches are paid once, not per phase
            shared = min(self.mla.context.overhead_s, self.mla.generation.overhead_s)
            pf, dec = pf - shared * pf / (pf + dec), dec - shared * dec / (pf + dec)
        terms[k("prefill_attention")] = layers * pf
        terms[k("decode_attention")] = layers * dec
        if self.mla.scope == "module":
            terms[k("qkv_proj")] = terms[k("o_proj")] = 0.0

    def _linear(self, batch: BatchShape) -> float:
        """One linear-attention layer: state read + written per request, delta-rule FLOPs per token
        (measured prefill and decode fits where they exist)."""
        if self.gdn is not None:
            dec = sum(1 for n in batch.num_new_tokens if n == 1)
            pf = [n for n in batch.num_new_tokens if n > 1]
            return self.gdn.decode(dec) + self.gdn.prefill(pf)
        c = self.base.decode
        rows = sum(1 for n in batch.num_new_tokens if n)
        tokens = sum(batch.num_new_tokens)
        memory = 2.0 * rows * self.linear_state_bytes * c.s_per_byte
        compute = tokens * self.linear_flops_per_token * c.s_per_flop
        return (compute if compute > memory else memory) + c.overhead_s

    def _mlp(self, batch: BatchShape, routed_all_layers: float, pad_to: int = 0) -> float:
        """The MLP term: the routed experts' (`routed_all_layers`, priced by the base over every layer)
        in the MoE layers, plus the dense layers' and shared experts' MLPs over the step's tokens (no
        fewer than `pad_to`)."""
        t = float(sum(batch.num_new_tokens))
        if t <= 0 or not self.moe_layers:
            return routed_all_layers  # a dense model: the base's MLP in every layer
        t = max(t, float(pad_to))  # (-1: unpadded, the tokens themselves)
        L, d = self.base.layers, self.base.dtype_bytes
        total = routed_all_layers / L * self.moe_layers
        if self.dense_mlp:
            up, down = self.dense_mlp
            total += (L - self.moe_layers) * (up.time(t, d) + down.time(t, d))
        if self.shared_mlp:
            up, down = self.shared_mlp
            total += self.moe_layers * (up.time(t, d) + down.time(t, d))
        return total


def _bounded(batch: BatchShape, kind: str, window: int) -> BatchShape:
    """The batch as a windowed layer sees it: context no longer than the window (or the current chunk)."""
    if kind == SLIDING:
        ctx = [min(c, window) for c in batch.num_context_tokens]
    else:
        ctx = [c % window for c in batch.num_context_tokens]
    return dataclasses.replace(batch, num_context_tokens=ctx)


def shaped_cost_model(base, breakdown_keys: tuple, kv_cache_dtype: str = "auto",
                      measured: bool = True) -> ShapedCostModel:
    """Wrap `base` (built by make_cost_model for a non-plain spec) with the per-layer-type operators;
    `measured` = use the modern kernel fits of this GPU where they exist."""
    spec, tp = base.model, base.tensor_parallel_size
    fields = _precision_matmuls(base, spec, measured)
    prefill_fields = fields
    if spec.is_mla:
        decode, prefill = _mla_fields(spec, tp, fields["qkv"], fields["o"])
        fields, prefill_fields = {**fields, **decode}, {**fields, **prefill}
    counts: dict[str, int] = {}
    for kind in spec.layer_types or (FULL,) * spec.num_layers:
        counts[kind] = counts.get(kind, 0) + 1
    shaped = dataclasses.replace(base, **fields)
    pre = dataclasses.replace(base, **prefill_fields) if spec.is_mla else shaped
    moe_layers = spec.num_layers - spec.first_k_dense_replace if spec.is_moe else 0
    scale = (base.gpu.bf16_flops_per_s / base.gpu.fp8_flops_per_s
             if spec.quant_method == "fp8" and base.gpu.fp8_flops_per_s else 1.0)
    mm = base.up.scaled(scale, (spec.weight_bytes or spec.dtype_bytes) / spec.dtype_bytes)  # dense precision

    def dense_op(k: float, n: float):
        like = mm.like(k, n)
        fp8 = measured and spec.quant_method == "fp8"
        return (gemm_op(base.gpu.name, weight_variant(spec), like, n, k) if fp8 else None) or like

    dense = ()
    if spec.is_moe and spec.first_k_dense_replace:
        inter = (spec.dense_intermediate_size or spec.intermediate_size) / tp
        dense = (dense_op(spec.hidden_size, 2 * inter), dense_op(inter, spec.hidden_size))
    shared = ()
    if spec.shared_expert_intermediate_size:
        inter = spec.shared_expert_intermediate_size / tp
        shared = (dense_op(spec.hidden_size, 2 * inter), dense_op(inter, spec.hidden_size))
    state = linear_state_bytes(spec, tp) if counts.get(LINEAR) else 0
    flops = (DELTA_RULE_FLOPS_PER_ELEMENT * spec.linear_num_value_heads / tp * spec.linear_key_head_dim
             * spec.linear_value_head_dim)
    mla = mla_kernels(base.gpu.name, spec, spec.num_heads / tp, kv_cache_dtype) if measured and spec.is_mla else None
    gdn = gdn_kernels(base.gpu.name, spec, tp) if measured and counts.get(LINEAR) else None
    return ShapedCostModel(tuple(breakdown_keys), shaped, pre, counts, spec.sliding_window, float(state), flops,
                           moe_layers, dense, shared, mla, gdn)
