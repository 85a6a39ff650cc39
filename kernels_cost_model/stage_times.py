"""A batch's seconds on each pipeline stage.

Stage i runs its own decoder layers' share of the per-layer work; the first stage also the input
embedding (and its all-reduce at TP > 1), the last stage the final norm, the LM head and the logits
all-gather (vLLM builds those modules on the first and last PP ranks only: stage_weights.py).

The engine's CPU time (the breakdown's `cpu`: schedule() and update_from_output()) is charged to the
first stage. vLLM V1's engine core with a batch queue (`EngineCore.step_with_batch_queue`) runs on one
thread: it schedules a batch and hands it to the executor without waiting, and schedules the next one
only after that; it blocks on the oldest batch and updates the scheduler from its output when the
queue is full. A batch therefore cannot enter the first stage before its schedule() has run, and the
scheduler plans the next batch when the first stage is free, so the CPU time sits in front of the
first stage, serial with it (not overlapped: async scheduling is off under PP).

Cost models with a `layer_seconds(batch)` (the roofline models) split the batch by layer class;
any other (LinearCostModel, a user's own) is split by layer share: stage i takes
step_time x layers_i / num_layers (exactly step_time / PP where the stages hold equal layers).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .model_shapes import FULL


@dataclass(frozen=True, slots=True)
class LayerSeconds:
    """A batch's seconds as the stages run them: one layer of each class, and what only the first
    stage (embedding, its all-reduce, the engine's CPU time) and the last (final norm, LM head, logits
    all-gather) run."""

    per_layer: dict
    first: float
    last: float


def stage_times(cost_model, batch, partition: tuple[int, ...]) -> tuple[float, ...]:
    """Seconds `batch` spends on each stage of `partition` (layers per stage, in order)."""
    split = getattr(cost_model, "layer_seconds", None)
    if split is None:
        return split_by_layers(cost_model.step_time(batch), partition)
    seconds = split(batch)
    counts = _class_counts(layer_classes(cost_model.model), tuple(partition))
    last = len(partition) - 1
    return tuple(sum(n * seconds.per_layer[c] for c, n in stage) + seconds.first * (i == 0)
                 + seconds.last * (i == last) for i, stage in enumerate(counts))


def split_by_layers(seconds: float, partition: tuple[int, ...]) -> tuple[float, ...]:
    """`seconds` shared by the stages by their layers (seconds / PP each where the layers are even)."""
    layers, pp = sum(partition), len(partition)
    return tuple(seconds / pp if n * pp == layers else seconds * n / layers for n in partition)


@lru_cache(maxsize=64)
def layer_classes(spec) -> tuple[str, ...]:
    """Each layer's class, in layer order: its attention kind, with "+moe" for a layer with routed
    experts (a DeepSeek-style model's first `first_k_dense_replace` layers are dense)."""
    kinds = spec.layer_types or (FULL,) * spec.num_layers
    dense = spec.first_k_dense_replace if spec.is_moe else spec.num_layers
    return tuple(kind + ("+moe" if i >= dense else "") for i, kind in enumerate(kinds))


@lru_cache(maxsize=256)
def _class_counts(classes: tuple[str, ...], partition: tuple[int, ...]) -> tuple[tuple, ...]:
    """Per stage, (class, layers of it) pairs."""
    out, start = [], 0
    for n in partition:
        own = classes[start:start + n]
        out.append(tuple((c, own.count(c)) for c in dict.fromkeys(own)))
        start += n
    return tuple(out)


def end_seconds(base, terms: dict, tokens: int) -> tuple[float, float]:
    """(first stage's own, last stage's own) GPU seconds of a batch of `tokens` tokens priced by the
    RooflineCostModel `base` as `terms` (its breakdown): the embedding (and the one all-reduce after
    it, of the 2 x layers + 1), then the final norm and the LM head term (logits all-gather included)."""
    if tokens <= 0:
        return 0.0, terms["lm_head"]
    d, h, t = base.dtype_bytes, base.hidden, base._padded(tokens)
    embed = base.embed.cost(d * 2.0 * t * h, t, d * h)
    norm = base.norm.cost(d * (2.0 * t * h + h), t, d * h)
    return embed + terms["all_reduce"] / (2.0 * base.layers + 1.0), norm + terms["lm_head"]


def roofline_layer_seconds(model, batch) -> LayerSeconds:
    """LayerSeconds of a RooflineCostModel: every layer alike."""
    terms = model.breakdown(batch)
    first, last = end_seconds(model, terms, sum(batch.num_new_tokens))
    gpu = sum(v for k, v in terms.items() if k != "cpu")
    per_layer = (gpu - first - last) / model.layers
    return LayerSeconds(dict.fromkeys(set(layer_classes(model.model)), per_layer), first + terms["cpu"], last)


def shaped_layer_seconds(model, batch) -> LayerSeconds:
    """LayerSeconds of a layer_ops.ShapedCostModel: the attention of each layer kind, the dense layers'
    MLP apart from the MoE layers' (routed experts, shared experts and router), the rest alike."""
    terms = model.breakdown(batch)
    base = model.base
    first, last = end_seconds(base, terms, sum(batch.num_new_tokens))
    attention = terms["prefill_attention"] + terms["decode_attention"]
    mlp = terms["mlp"] + terms["moe_routing"]
    gpu = sum(v for k, v in terms.items() if k != "cpu")
    L = base.layers
    common = (gpu - attention - mlp - first - last) / L
    by_kind = model.attention_by_kind(batch)
    weight = sum(by_kind.values())
    dense = model.dense_mlp_s(batch)
    moe = (mlp - (L - model.moe_layers) * dense) / model.moe_layers if model.moe_layers else 0.0
    per_layer = {}
    for c in set(layer_classes(model.model)):
        kind = c.removesuffix("+moe")
        attn = (attention * by_kind.get(kind, 0.0) / weight / model.counts[kind] if weight > 0
                else attention / L)
        per_layer[c] = common + attn + (moe if c.endswith("+moe") else dense if model.moe_layers else mlp / L)
    return LayerSeconds(per_layer, first + terms["cpu"], last)
