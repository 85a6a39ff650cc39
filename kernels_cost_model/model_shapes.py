"""The parts of a Hugging Face config.json beyond plain grouped-query attention.

Reads, from a config.json dict, what the models people deploy now add to a transformer:
multi-head latent attention (DeepSeek-V3: `kv_lora_rank`, `qk_rope_head_dim`, ...), per-layer
attention types (`layer_types`, Gemma-3's `sliding_window_pattern`, Qwen3-Next's
`full_attention_interval`, Llama-4's `attention_chunk_size`), linear-attention (Gated DeltaNet)
state sizes, shared experts and leading dense layers, and the weight precision
(`torch_dtype`, `quantization_config`). Returns ModelSpec keyword arguments; models.py builds the spec.
"""
from __future__ import annotations

#: Layer kinds, with vLLM's names for the attention types.
FULL, SLIDING, CHUNKED, LINEAR = "full_attention", "sliding_attention", "chunked_attention", "linear_attention"
LAYER_KINDS = (FULL, SLIDING, CHUNKED, LINEAR)

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}
#: MXFP4: 4-bit values plus one 8-bit scale per 32 (OCP Microscaling spec v1.0) = 4.25 bits per weight.
MXFP4_BYTES = 4.25 / 8


def layer_types(cfg: dict, num_layers: int) -> tuple[str, ...]:
    """Attention type of every layer; () when every layer is full attention (the plain case)."""
    types = cfg.get("layer_types")
    if types:
        kinds = tuple(str(t) for t in types)[:num_layers]
    elif cfg.get("full_attention_interval"):  # Qwen3-Next: every k-th layer is full, the rest linear
        k = int(cfg["full_attention_interval"])
        kinds = tuple(FULL if (i + 1) % k == 0 else LINEAR for i in range(num_layers))
    elif cfg.get("sliding_window_pattern") and cfg.get("sliding_window"):  # Gemma-3: every k-th is global
        k = int(cfg["sliding_window_pattern"])
        kinds = tuple(FULL if (i + 1) % k == 0 else SLIDING for i in range(num_layers))
    elif cfg.get("attention_chunk_size"):  # Llama-4: every 4th layer global (NoPE), others chunked local
        rope = cfg.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(num_layers)]
        kinds = tuple(CHUNKED if rope[i] else FULL for i in range(num_layers))
    elif cfg.get("sliding_window") and cfg.get("use_sliding_window", True) is not False:
        kinds = (SLIDING,) * num_layers  # Mistral-7B-v0.1 style: every layer windowed
    else:
        return ()
    return () if all(k == FULL for k in kinds) else kinds


#: Model types whose softmax-attention layers RMS-normalise each query and key head (over head_dim) before
#: RoPE: Hugging Face's and vLLM's Qwen3Attention, Qwen3MoeAttention, Qwen3NextAttention, Gemma3Attention.
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen3_next", "gemma3", "gemma3_text")


def qk_norm_layers_of(cfg: dict, outer_type: str | None, num_layers: int) -> int:
    """Layers that normalise their query and key heads: every softmax-attention layer of the model types
    above (`outer_type`: a multimodal config's own model_type) or of a config with `use_qk_norm` (GLM-4.5);
    Llama-4's `use_qk_norm` only in its RoPE (chunked) layers, as vLLM's Llama4Attention. Decided by
    `model_type`: a config.json without it gets none."""
    kinds = layer_types(cfg, num_layers) or (FULL,) * num_layers
    model_type = str(cfg.get("model_type") or outer_type or "")
    if model_type in QK_NORM_MODEL_TYPES or (cfg.get("use_qk_norm") and not model_type.startswith("llama4")):
        return sum(1 for kind in kinds if kind != LINEAR)
    if cfg.get("use_qk_norm"):
        return sum(1 for kind in kinds if kind == CHUNKED)
    return 0


def weight_bytes(cfg: dict, dtype_bytes: int) -> tuple[float, float, str]:
    """(bytes per dense weight, bytes per expert weight, quantisation method) from quantization_config."""
    quant = cfg.get("quantization_config") or {}
    method = str(quant.get("quant_method", "") or "")
    if method == "fp8" or "float8" in str(quant.get("fmt", "")) or method == "fbgemm_fp8":
        return 1.0, 1.0, "fp8"
    if method == "mxfp4":  # gpt-oss: experts in MXFP4, attention/router/embeddings left in BF16
        return float(dtype_bytes), MXFP4_BYTES, "mxfp4"
    if method == "compressed-tensors" and _compressed_fp8(quant):
        return 1.0, 1.0, "fp8"
    return float(dtype_bytes), float(dtype_bytes), method


def _compressed_fp8(quant: dict) -> bool:
    groups = quant.get("config_groups") or {}
    return any((g.get("weights") or {}).get("type") == "float" and (g.get("weights") or {}).get("num_bits") == 8
               for g in groups.values())


def extended_fields(cfg: dict, num_layers: int) -> dict:
    """ModelSpec keyword arguments for everything beyond plain attention (absent keys give 0 / ())."""
    dtype_bytes = _DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2)
    dense_b, expert_b, method = weight_bytes(cfg, dtype_bytes)
    get = lambda key: int(cfg.get(key) or 0)  # noqa: E731 - short local reader
    return dict(
        layer_types=layer_types(cfg, num_layers),
        sliding_window=int(cfg.get("attention_chunk_size") or cfg.get("sliding_window") or 0),
        q_lora_rank=get("q_lora_rank"), kv_lora_rank=get("kv_lora_rank"),
        qk_nope_head_dim=get("qk_nope_head_dim"), qk_rope_head_dim=get("qk_rope_head_dim"),
        v_head_dim=get("v_head_dim"),
        linear_num_key_heads=get("linear_num_key_heads"), linear_num_value_heads=get("linear_num_value_heads"),
        linear_key_head_dim=get("linear_key_head_dim"), linear_value_head_dim=get("linear_value_head_dim"),
        linear_conv_kernel_dim=get("linear_conv_kernel_dim"),
        ssm_state_dtype_bytes=_DTYPE_BYTES.get(str(cfg.get("mamba_ssm_dtype")), 0),
        n_shared_experts=get("n_shared_experts") or (1 if _shared_width(cfg) else 0),
        shared_expert_intermediate_size=_shared_width(cfg),
        first_k_dense_replace=get("first_k_dense_replace"),
        dense_intermediate_size=get("intermediate_size_mlp"),
        weight_bytes=dense_b, expert_weight_bytes=expert_b, quant_method=method,
        weight_block_size=int(((cfg.get("quantization_config") or {}).get("weight_block_size") or [0])[0])
        if method == "fp8" else 0,
    )


def _shared_width(cfg: dict) -> int:
    """Width of the shared experts: Qwen's shared_expert_intermediate_size, DeepSeek's n_shared_experts x
    moe_intermediate_size, Llama-4's one shared expert of intermediate_size (its MoE always has one)."""
    if cfg.get("shared_expert_intermediate_size"):
        return int(cfg["shared_expert_intermediate_size"])
    if cfg.get("n_shared_experts"):
        return int(cfg["n_shared_experts"]) * int(cfg.get("moe_intermediate_size") or 0)
    if cfg.get("intermediate_size_mlp") and cfg.get("num_local_experts"):
        return int(cfg["intermediate_size"])
    return 0


def num_experts_of(cfg: dict) -> int:
    return int(cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0)


def num_mtp_layers_of(cfg: dict) -> int:
    """Multi-token-prediction layers the checkpoint ships, which vLLM's "mtp" proposer drafts with:
    DeepSeek-V3's `num_nextn_predict_layers`, Qwen3-Next / Qwen3.5's `mtp_num_hidden_layers`."""
    return int(cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 0)


def head_dim_of(cfg: dict, hidden: int, heads: int) -> int:
    """Per-head query width: MLA's nope + rope parts, else head_dim, else hidden / heads."""
    if cfg.get("kv_lora_rank"):
        return int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])
    return int(cfg.get("head_dim") or hidden // heads)


# ----- parameter count of the extended shapes -------------------------------------------------------
def attention_params(spec) -> int:
    """Weights of one attention layer (MLA's low-rank projections when kv_lora_rank > 0)."""
    h = spec.hidden_size
    if spec.kv_lora_rank:
        q = (h * spec.q_lora_rank + spec.q_lora_rank * spec.num_heads * spec.head_dim if spec.q_lora_rank
             else h * spec.num_heads * spec.head_dim)
        kv = h * (spec.kv_lora_rank + spec.qk_rope_head_dim) + spec.kv_lora_rank * spec.num_heads * (
            spec.qk_nope_head_dim + spec.v_head_dim)
        return q + kv + spec.num_heads * spec.v_head_dim * h
    return h * (spec.q_dim + 2 * spec.kv_dim) + spec.q_dim * h


def linear_attention_params(spec) -> int:
    """Gated DeltaNet layer: q/k/v/z/beta/alpha input projections, depthwise conv, output projection."""
    h = spec.hidden_size
    key, value = spec.linear_num_key_heads * spec.linear_key_head_dim, spec.linear_num_value_heads * spec.linear_value_head_dim
    conv = (2 * key + value) * spec.linear_conv_kernel_dim
    return h * (2 * key + 2 * value + 2 * spec.linear_num_value_heads) + conv + value * h


def split_params(spec) -> tuple[int, int]:
    """(dense parameters, routed-expert parameters): they can be stored at different precisions."""
    h, layers = spec.hidden_size, spec.num_layers
    kinds = spec.layer_types or ()
    n_linear = sum(1 for k in kinds if k == LINEAR)
    attn = (layers - n_linear) * attention_params(spec) + n_linear * linear_attention_params(spec)
    dense_layers = spec.first_k_dense_replace if spec.is_moe else layers
    moe_layers = layers - dense_layers
    dense_inter = spec.dense_intermediate_size or spec.intermediate_size
    dense_mlp = dense_layers * 3 * h * dense_inter
    shared = moe_layers * 3 * h * spec.shared_expert_intermediate_size
    router = moe_layers * h * spec.num_experts
    experts = moe_layers * spec.num_experts * 3 * h * spec.moe_intermediate_size
    embed = spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    return attn + dense_mlp + shared + router + layers * 2 * h + embed + h, experts
