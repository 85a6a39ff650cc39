"""Model catalog (shapes from each model's Hugging Face config.json) and offline config.json reading.

Covers grouped-query attention (num_kv_heads < num_heads) and mixture-of-experts
(num_experts > 0: each token visits num_experts_per_tok experts of moe_intermediate_size).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kernels_cost_model.errors import ConfigError, read_json_file, require

from .architectures import architecture_of
from ._catalog import alias_index, normalise, read_catalog, read_config_catalog
from .model_shapes import (LINEAR, extended_fields, head_dim_of, num_experts_of, num_mtp_layers_of, qk_norm_layers_of,
                           split_params)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Transformer shape. A dense model has num_experts == 0."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    dtype_bytes: int = 2
    source: str = ""
    # -- beyond plain attention (model_shapes.py); the defaults describe a plain model --------------
    layer_types: tuple[str, ...] = ()      # per-layer attention type; () = every layer full attention
    sliding_window: int = 0                # window of sliding layers, or Llama-4's chunk of chunked ones
    q_lora_rank: int = 0                   # MLA (DeepSeek-V3): low-rank query and compressed KV
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    linear_num_key_heads: int = 0          # linear-attention (Gated DeltaNet) layers
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    ssm_state_dtype_bytes: int = 0         # recurrent state bytes per value (0 = model dtype, vLLM's "auto")
    n_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    first_k_dense_replace: int = 0         # leading layers with a dense MLP in an MoE model
    dense_intermediate_size: int = 0       # their width when it differs from intermediate_size
    weight_bytes: float = 0.0              # bytes per dense weight (0 = dtype_bytes)
    expert_weight_bytes: float = 0.0       # bytes per routed-expert weight (0 = weight_bytes)
    quant_method: str = ""
    weight_block_size: int = 0             # FP8 block-scale tile (DeepSeek: 128); 0 = per-tensor scales
    num_mtp_layers: int = 0                # the checkpoint's own multi-token-prediction layers (vLLM's "mtp")
    qk_norm_layers: int = 0                # layers that RMS-normalise each query and key head before RoPE
    architecture: str = ""                 # vLLM's model class (architectures.py); "" = unknown

    def __post_init__(self) -> None:
        for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "vocab_size", "dtype_bytes"):
            require(getattr(self, field) > 0, field, getattr(self, field), "must be > 0")
        require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", self.num_kv_heads,
                f"must divide num_heads={self.num_heads}")
        require(0 <= self.qk_norm_layers <= self.num_layers, "qk_norm_layers", self.qk_norm_layers,
                f"must be in 0..num_layers={self.num_layers}")
        if self.num_experts:
            require(0 < self.num_experts_per_tok <= self.num_experts, "num_experts_per_tok",
                    self.num_experts_per_tok, f"must be in 1..num_experts={self.num_experts}")
            require(self.moe_intermediate_size > 0, "moe_intermediate_size",
                    self.moe_intermediate_size, "must be > 0 for a mixture-of-experts model")
        else:
            require(self.intermediate_size > 0, "intermediate_size", self.intermediate_size, "must be > 0")

    @property
    def is_plain(self) -> bool:
        """Every layer full grouped-query attention at one precision: the original catalog's shape."""
        return not (self.layer_types or self.kv_lora_rank or self.n_shared_experts or self.first_k_dense_replace
                    or self.dense_intermediate_size or self.weight_bytes or self.expert_weight_bytes)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_linear_layers(self) -> int:
        return sum(1 for k in self.layer_types if k == LINEAR)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_params(self) -> int:
        """Parameter count (weights only; biases and norms' few vectors included roughly)."""
        if not self.is_plain:
            return sum(split_params(self))
        h = self.hidden_size
        attn = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        if self.is_moe:
            mlp = self.num_experts * 3 * h * self.moe_intermediate_size + h * self.num_experts
        else:
            mlp = 3 * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attn + mlp + 2 * h) + embed + h

    def weight_bytes_total(self) -> float:
        """Bytes of all weights at their stored precision (FP8, MXFP4 experts, or dtype_bytes)."""
        if self.is_plain:
            return self.num_params() * self.dtype_bytes
        dense, experts = split_params(self)
        dense_b = self.weight_bytes or self.dtype_bytes
        return dense * dense_b + experts * (self.expert_weight_bytes or dense_b)


def _row_to_spec(row: dict[str, str]) -> ModelSpec:
    ints = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
            "vocab_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
            "max_position_embeddings", "dtype_bytes")
    qk_norm = row["qk_norm"].lower() == "true"
    return ModelSpec(name=row["name"], source=row["source"], architecture=row["architecture"],
                     tie_word_embeddings=row["tie_word_embeddings"].lower() == "true",
                     qk_norm_layers=int(row["num_layers"]) if qk_norm else 0,
                     **{k: int(row[k]) for k in ints})


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    rows = read_catalog("models.csv")
    models = {r["name"]: _row_to_spec(r) for r in rows}
    modern = read_config_catalog("models_modern.json")
    for entry in modern:  # config.json excerpts, parsed like a user's config.json
        models[entry["name"]] = spec_from_config(entry["config"], entry["name"], entry["source"])
    return models, alias_index(rows + modern)


def list_models() -> list[str]:
    """Canonical names of the models in the catalog."""
    return sorted(_catalog()[0])


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


def model_from_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face config.json (offline): Llama, Mistral, Qwen2/3, Mixtral, Qwen-MoE, DeepSeek-V3,
    gpt-oss, Gemma-3, Qwen3-Next, Llama-4 styles."""
    path = Path(path)
    cfg = read_json_file("model", path, "cannot read config.json")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("text_config", cfg), dict):
        raise ConfigError("model", str(path), "config.json must hold a JSON object of model settings")
    return spec_from_config(cfg, name=None, source=str(path), fallback_name=path.parent.name or str(path))


def spec_from_config(cfg: dict, name: str | None, source: str, fallback_name: str = "") -> ModelSpec:
    """ModelSpec of a config.json dict (a multimodal config's `text_config` is read)."""
    outer_quant, outer_type, architecture = cfg.get("quantization_config"), cfg.get("model_type"), architecture_of(cfg)
    cfg = cfg.get("text_config", cfg)
    if outer_quant and "quantization_config" not in cfg:
        cfg = dict(cfg, quantization_config=outer_quant)
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        layers = int(cfg["num_hidden_layers"])
        experts = num_experts_of(cfg)
        extra = extended_fields(cfg, layers)
        if not any(extra[k] for k in ("layer_types", "kv_lora_rank", "n_shared_experts",
                                      "first_k_dense_replace", "dense_intermediate_size", "quant_method")):
            extra = {}  # a plain model: exactly the shape the original parser gave
        else:
            extra["weight_bytes"] = extra["weight_bytes"] if extra["quant_method"] else 0.0
            extra["expert_weight_bytes"] = extra["expert_weight_bytes"] if extra["quant_method"] else 0.0
        return ModelSpec(
            name=name or cfg.get("_name_or_path") or fallback_name,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim_of(cfg, hidden, heads),
            intermediate_size=int(cfg.get("intermediate_size", 0) if experts else cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            num_experts=experts,
            num_experts_per_tok=int(cfg.get("num_experts_per_tok", 0)) if experts else 0,
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size", 0))
            if experts else 0,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            dtype_bytes=_DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2),
            num_mtp_layers=num_mtp_layers_of(cfg), qk_norm_layers=qk_norm_layers_of(cfg, outer_type, layers),
            architecture=architecture, source=source, **extra,
        )
    except KeyError as exc:
        raise ConfigError("model", source, f"config.json lacks required key {exc}") from exc
    except (AttributeError, TypeError, ValueError) as exc:
        raise ConfigError("model", source, f"config.json has a malformed value: {exc}") from exc


def get_model(name: str | Path | ModelSpec) -> ModelSpec:
    """Catalog lookup by name/alias/HF id (case-insensitive), or a path to a local config.json."""
    if isinstance(name, ModelSpec):
        return name
    text = str(name)
    if text.endswith(".json") or Path(text).is_dir() and (Path(text) / "config.json").exists():
        path = Path(text)
        return model_from_config(path / "config.json" if path.is_dir() else path)
    models, index = _catalog()
    canonical = index.get(normalise(text))
    if canonical is None:
        raise ConfigError("model", name, f"unknown model; known: {', '.join(list_models())}, "
                                         "or pass the path of a Hugging Face config.json")
    return models[canonical]
