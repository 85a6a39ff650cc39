"""Multi-head latent attention (DeepSeek-V3) as (FLOPs, bytes) per layer on one GPU, for fitting and pricing.

Shape terms (ModelSpec fields): hidden h, q_lora_rank r_q, kv_lora_rank r, rope dim d_r, nope dim d_n,
value dim d_v, H query heads on this GPU. The module's weights: the replicated down-projections
h x (r_q + r + d_r) (h x H(d_n + d_r) for the query when r_q = 0), and per head the query up-projection
r_q x (d_n + d_r), the KV up-projection r x (d_n + d_v) and the output projection d_v x h.

- generation (decode, absorbed as vLLM's MLA backends run it): every head reads the shared latent of
  every key: 2 (r + d_r + r) FLOPs per key and head, (r + d_r) x kv bytes per key; each token runs
  every weight once (the KV up-projection is folded into the query and output sides).
- context (prefill, not absorbed): K and V are expanded per head for the new tokens (and for any
  cached prefix, which vLLM's chunked MLA prefill re-expands); 2 (d_n + d_r + d_v) FLOPs per
  query-key pair and head.
`scope` "module" counts the projections (vLLM 0.24 tables), "kernel" the attention alone (vLLM 0.14).
A module's prefill runs two kinds of kernel, the projection GEMMs and the attention kernel, at rates
of their own: `split_context` takes the attention FLOPs apart for its fit (s_per_attention_flop).
Its hidden states beyond the L2 make a round trip to DRAM that the GEMMs' compute does not hide
(`context_spilled_bytes`, s_per_spilled_byte).
"""
from __future__ import annotations

ACT_BYTES = 2.0  # activations are bf16 in every table


def weight_elements(spec, heads: float) -> float:
    """Weights of one MLA layer on a GPU holding `heads` query heads."""
    h, r, dr, dn, dv = spec.hidden_size, spec.kv_lora_rank, spec.qk_rope_head_dim, spec.qk_nope_head_dim, spec.v_head_dim
    rq = spec.q_lora_rank
    shared = h * (rq + r + dr)
    q_up = rq * (dn + dr) if rq else h * (dn + dr)
    return shared + heads * (q_up + r * (dn + dv) + dv * h)


def generation_cost(spec, heads: float, batch: float, keys: float, kv_bytes: float, weight_bytes: float,
                    scope: str = "module", read_weights: bool = True) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step of `batch` sequences, `keys` cached keys in all;
    `read_weights=False` when a prefill in the same step has already read the module's weights."""
    r, dr = spec.kv_lora_rank, spec.qk_rope_head_dim
    flops = 2.0 * heads * (2 * r + dr) * keys
    nbytes = (r + dr) * kv_bytes * keys + ACT_BYTES * batch * heads * (2 * r + dr)
    if scope == "module":
        w = weight_elements(spec, heads)
        flops += 2.0 * batch * w
        nbytes += weight_bytes * w * read_weights + ACT_BYTES * 2.0 * batch * spec.hidden_size
    return flops, nbytes


def context_cost(spec, heads: float, tokens: float, pairs: float, cached: float, kv_bytes: float,
                 weight_bytes: float, scope: str = "module") -> tuple[float, float]:
    """(FLOPs, bytes) of a prefill of `tokens` new tokens with `pairs` causal query-key pairs over
    `cached` prefix tokens (their latents re-expanded per head)."""
    r, dr, dn, dv = spec.kv_lora_rank, spec.qk_rope_head_dim, spec.qk_nope_head_dim, spec.v_head_dim
    expand = r * (dn + dv) * heads
    flops = 2.0 * heads * (dn + dr + dv) * pairs + 2.0 * cached * expand
    per_token = heads * (2 * (dn + dr) + 2 * dv)  # q, k, v, out per head
    nbytes = (ACT_BYTES * (tokens + cached) * per_token + (r + dr) * kv_bytes * (tokens + cached))
    if scope == "module":
        w = weight_elements(spec, heads)
        flops += 2.0 * tokens * w
        nbytes += weight_bytes * w + ACT_BYTES * 2.0 * tokens * spec.hidden_size
    return flops, nbytes


def context_attention_flops(spec, heads: float, pairs: float) -> float:
    """FLOPs of a prefill's attention kernel: its score and value products over `pairs` causal
    query-key pairs per head."""
    return 2.0 * heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim) * pairs


def split_context(spec, heads: float, tokens: float, pairs: float, cached: float, kv_bytes: float,
                  weight_bytes: float, scope: str = "module") -> tuple[float, float, float]:
    """`context_cost` as (FLOPs of the rest, bytes, attention kernel FLOPs): a module's attention is
    taken apart from its projections; a kernel-only fit keeps one rate (attention FLOPs 0)."""
    flops, nbytes = context_cost(spec, heads, tokens, pairs, cached, kv_bytes, weight_bytes, scope)
    if scope != "module":
        return flops, nbytes, 0.0
    attention = context_attention_flops(spec, heads, pairs)
    return flops - attention, nbytes, attention


def context_spilled_bytes(spec, tokens: float, l2_bytes: float, scope: str = "module") -> float:
    """Bytes of a module prefill's hidden states ([tokens x hidden], bf16) beyond the L2 (0 for a
    kernel-only fit, which has no projections).

    While the hidden states fit in L2 the module's passes over them (its down-projections' input, its
    norms and output) hit it; beyond, the excess streams from DRAM in kernels that run one after another,
    so it adds to the GEMMs' time instead of hiding under their compute. AIConfigurator's MLA context
    tables show it wherever the projections are light (few heads): at 1 head the time per token is least
    near L2 / (2 x 7168) tokens (L40S, 96 MiB: 4-8 k tokens; RTX PRO 6000, 128 MiB: 8 k) and then grows
    by 26-46 % up to 131 k tokens, whatever the batch x length split. One tensor's size sets the knee
    best: counting the output too (the knee at half) or the latents left more error on both GPUs."""
    if scope != "module":
        return 0.0
    return max(ACT_BYTES * tokens * spec.hidden_size - l2_bytes, 0.0)
