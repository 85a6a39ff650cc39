"""Weights on each pipeline stage, placed as vLLM's decoder models place them.

A stage holds its own decoder layers (the partition of kernels_cost_model.pipeline.layer_partition)
and the embedding, final norm and LM head its architecture's vLLM model class builds there, each
vocabulary-parallel (1/TP per rank) (kernels_cost_model.architectures):

- the Llama family (Llama, Mistral, Llama 4, Qwen2/3, DeepSeek-V2/V3, and a config of unknown class):
  the first stage holds the input embedding, the last the final norm and the LM head; with
  `tie_word_embeddings` the last stage builds the embedding too and shares it with its LM head, so a
  tied model holds one copy at PP 1 and one on each end stage at PP > 1 (llama.py `LlamaModel`,
  `LlamaForCausalLM`);
- Mixtral, Qwen3-MoE, gpt-oss, Gemma 3, Qwen3-Next: every stage builds all three (mixtral.py
  `MixtralModel`, qwen3_moe.py `Qwen3MoeModel`, ...), one table when tied.

Dense layers of a DeepSeek-style MoE model (`first_k_dense_replace`) are its first layers, so they
fall on the first stages.
"""
from __future__ import annotations

from .architectures import ends_on_every_stage
from .hardware import get_gpu
from .kv_memory import weight_bytes_per_gpu
from .model_shapes import LINEAR, attention_params, linear_attention_params
from .models import get_model
from .mxfp4_layout import backend_for, expert_bytes


def layer_params(spec) -> list[tuple[int, int]]:
    """(dense, routed-expert) parameters of each decoder layer, in layer order; with the embedding and
    head (`end_params`) they add up to ModelSpec.num_params / model_shapes.split_params."""
    h = spec.hidden_size
    kinds = spec.layer_types or ()
    dense_layers = spec.first_k_dense_replace if spec.is_moe and not spec.is_plain else spec.num_layers
    out = []
    for i in range(spec.num_layers):
        attn = (linear_attention_params(spec) if i < len(kinds) and kinds[i] == LINEAR
                else attention_params(spec))
        if spec.is_plain and spec.is_moe:   # one precision: experts and router counted as dense weights
            out.append((attn + spec.num_experts * 3 * h * spec.moe_intermediate_size + h * spec.num_experts
                        + 2 * h, 0))
        elif i < dense_layers:
            out.append((attn + 3 * h * (spec.dense_intermediate_size or spec.intermediate_size) + 2 * h, 0))
        else:
            shared = 3 * h * spec.shared_expert_intermediate_size + h * spec.num_experts
            out.append((attn + shared + 2 * h, spec.num_experts * 3 * h * spec.moe_intermediate_size))
    return out


def end_params(spec, first: bool, last: bool) -> int:
    """Parameters of the embedding, final norm and LM head a stage holds (whole, before the TP split):
    as an end stage of the Llama family, or both ends on every stage of an architecture that builds
    them on every PP rank (architectures.EVERY_STAGE)."""
    table = spec.vocab_size * spec.hidden_size
    if ends_on_every_stage(spec.architecture):
        first = last = True
    params = (table if first else 0) + (table + spec.hidden_size if last else 0)
    return params - table if first and last and spec.tie_word_embeddings else params


def stage_weight_bytes(model, tensor_parallel_size: int, gpu, partition: tuple[int, ...]) -> tuple[int, ...]:
    """Weight bytes on each GPU of each stage of `partition` (layers per stage). One stage: exactly
    kv_memory.weight_bytes_per_gpu. MXFP4 experts as that function lays them out for `gpu`."""
    spec, tp = get_model(model), tensor_parallel_size
    if len(partition) == 1:
        return (weight_bytes_per_gpu(spec, tp, gpu),)
    layers, out, start = layer_params(spec), [], 0
    for stage, n in enumerate(partition):
        own = layers[start:start + n]
        dense = sum(d for d, _ in own) + end_params(spec, stage == 0, stage == len(partition) - 1)
        experts = sum(e for _, e in own)
        out.append(_bytes(spec, tp, gpu, dense, experts, sum(1 for _, e in own if e)))
        start += n
    return tuple(out)


def _bytes(spec, tp: int, gpu, dense: int, experts: int, moe_layers: int) -> int:
    """Bytes per GPU of `dense` and `experts` parameters (`moe_layers` layers of routed experts)."""
    if spec.is_plain:
        return dense * spec.dtype_bytes // tp
    dense_b = spec.weight_bytes or spec.dtype_bytes
    if spec.quant_method != "mxfp4" or gpu is None:
        return int(dense * dense_b + experts * (spec.expert_weight_bytes or dense_b)) // tp
    backend = backend_for(get_gpu(gpu))
    per_layer = spec.num_experts * expert_bytes(spec.hidden_size, spec.moe_intermediate_size // tp, backend)
    return int(dense * dense_b) // tp + moe_layers * per_layer
