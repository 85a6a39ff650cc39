"""max_model_len as vLLM derives it: the model's own maximum context unless the user asks for less.

vLLM takes the limit from the model's Hugging Face config (max_position_embeddings here) and refuses
a larger `--max-model-len` ("User-specified max_model_len ... is greater than the derived
max_model_len ..."); it does not default to a fixed length.
"""
from __future__ import annotations

from kernels_cost_model.errors import require

from .models import get_model


def model_max_len(model) -> int:
    """The longest sequence (prompt plus output) the model was built for."""
    return get_model(model).max_position_embeddings


def resolve_max_model_len(model, requested: int | None) -> int:
    """`requested`, checked against the model's maximum; None gives the model's maximum."""
    spec = get_model(model)
    if requested is None:
        return spec.max_position_embeddings
    require(requested <= spec.max_position_embeddings, "max_model_len", requested,
            f"exceeds {spec.name}'s maximum context of {spec.max_position_embeddings} tokens"
            " (leave it unset for the model's maximum, as vLLM does)")
    return requested
