"""Model catalog (shapes from each model's Hugging Face config.json) and offline config.json reading.

Covers grouped-query attention (num_kv_heads < num_heads) and mixture-of-experts
(num_experts > 0: each token visits num_experts_per_tok experts of moe_intermediate_size).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kernels_cost_model.errors import ConfigError, require

from ._catalog import alias_index, normalise, read_catalog


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

    def __post_init__(self) -> None:
        for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "vocab_size", "dtype_bytes"):
            require(getattr(self, field) > 0, field, getattr(self, field), "must be > 0")
        require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", self.num_kv_heads,
                f"must divide num_heads={self.num_heads}")
        if self.num_experts:
            require(0 < self.num_experts_per_tok <= self.num_experts, "num_experts_per_tok",
                    self.num_experts_per_tok, f"must be in 1..num_experts={self.num_experts}")
            require(self.moe_intermediate_size > 0, "moe_intermediate_size",
                    self.moe_intermediate_size, "must be > 0 for a mixture-of-experts model")
        else:
            require(self.intermediate_size > 0, "intermediate_size", self.intermediate_size, "must be > 0")

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
        h = self.hidden_size
        attn = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        if self.is_moe:
            mlp = self.num_experts * 3 * h * self.moe_intermediate_size + h * self.num_experts
        else:
            mlp = 3 * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attn + mlp + 2 * h) + embed + h


def _row_to_spec(row: dict[str, str]) -> ModelSpec:
    ints = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
            "vocab_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
            "max_position_embeddings", "dtype_bytes")
    return ModelSpec(name=row["name"], source=row["source"],
                     tie_word_embeddings=row["tie_word_embeddings"].lower() == "true",
                     **{k: int(row[k]) for k in ints})


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    rows = read_catalog("models.csv")
    return {r["name"]: _row_to_spec(r) for r in rows}, alias_index(rows)


def list_models() -> list[str]:
    """Canonical names of the models in the catalog."""
    return sorted(_catalog()[0])


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


def model_from_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face config.json (offline): Llama, Mistral, Qwen2/3, Mixtral, Qwen-MoE styles."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError("model", str(path), f"cannot read config.json: {exc}") from exc
    if not isinstance(cfg, dict) or not isinstance(cfg.get("text_config", cfg), dict):
        raise ConfigError("model", str(path), "config.json must hold a JSON object of model settings")
    cfg = cfg.get("text_config", cfg)
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        experts = int(cfg.get("num_local_experts", cfg.get("num_experts", 0)) or 0)
        return ModelSpec(
            name=cfg.get("_name_or_path") or path.parent.name or str(path),
            hidden_size=hidden,
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg.get("intermediate_size", 0) if experts else cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            num_experts=experts,
            num_experts_per_tok=int(cfg.get("num_experts_per_tok", 0)) if experts else 0,
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size", 0))
            if experts else 0,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            dtype_bytes=_DTYPE_BYTES.get(str(cfg.get("torch_dtype", "bfloat16")), 2),
            source=str(path),
        )
    except KeyError as exc:
        raise ConfigError("model", str(path), f"config.json lacks required key {exc}") from exc
    except (AttributeError, TypeError, ValueError) as exc:
        raise ConfigError("model", str(path), f"config.json has a malformed value: {exc}") from exc


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
