"""What speculative decoding costs: the target's verification step, the proposer's time per step,
and memory for the proposer's weights and KV.

Verification (`verify_step_time`): a running request's row of 1 + k query tokens (its last token
and k drafts) is a decode-like row, not a prefill chunk: vLLM runs it through the decode attention
path (uniform `1 + k`-query batches, CUDA graphs), reading the request's KV once for all its
queries, which share the kernel's query tile as a GQA group's heads do in plain decode. So the
step is priced as the same batch with every verification row turned into one decode row over all
its keys (context + k + 1) for attention, while the matmuls, norms, LM head (logits for every
verified position) and collectives see every query token. A row that still carries prompt tokens
besides its drafts (a prefill chunk ending in drafts) stays a prefill chunk.

The proposer runs after the target in the same step (vLLM V1 drafts in the model runner, right
after sampling):

- "eagle", "eagle3", "mtp": a one-layer head of the target's shape. Its first pass reads the
  target's hidden states for every scheduled token (same rows as the target batch); then k - 1
  passes of one token per proposing request. Plus `draft_overhead_s` per step. A draft tree
  (`tree_widths`: nodes per depth) replaces those passes by one per depth but the last, each
  over the previous depth's nodes of every proposing request (decode-like rows, as above).
- "draft_model": the same passes through the draft model's own cost model.
- "ngram": prompt lookup on the CPU, `ngram_fraction_of_step` of the target step.

Defaults (uncertain figures, override per config):
- NGRAM_FRACTION_OF_STEP = 0.005875: n-gram drafting time as a share of verification, Llama-3.1-8B
  on H100 (SpecDecode-Bench simulator, predictor.py `ngram_draft_percentage`, arXiv 2601.11580).
- DRAFT_OVERHEAD_S = 0.5e-3: per-step drafting time our one-layer roofline does not see (input
  preparation, EAGLE-3's fusion of three hidden states, launches): SpecDecode-Bench's fit of the
  EAGLE-3 drafter on H100 for Llama-3.1-8B (predictor.py: 2.14 ms fixed + 0.84 us per draft token
  + 2.4 ns per KV token) minus our roofline's 1.60 ms for its three one-layer passes at batch 1.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import require

from .kv_memory import kv_bytes_per_token, kv_cache_blocks, weight_bytes_per_gpu
from .models import ModelSpec, get_model

NGRAM_FRACTION_OF_STEP = 0.005875
DRAFT_OVERHEAD_S = 0.5e-3
HEAD_METHODS = ("eagle", "eagle3", "mtp")
#: Breakdown families that depend on how rows split into prefill and decode (the rest see tokens only).
ATTENTION_KEYS = ("prefill_attention", "decode_attention")


def verify_step_time(cost_model, batch: BatchShape, drafts: list[int]) -> float:
    """Seconds for a step whose row i verifies `drafts[i]` draft tokens (0: a plain row).

    Needs a cost model with a per-family `breakdown` (the roofline ones); a model without one (the
    linear model, which does not tell prefill from decode) prices the batch as it is."""
    if not any(drafts):
        return cost_model.step_time(batch)
    breakdown = getattr(cost_model, "breakdown", None)
    whole = breakdown(batch) if breakdown is not None else {}
    if "decode_attention" not in whole:
        return cost_model.step_time(batch)
    new, ctx = list(batch.num_new_tokens), list(batch.num_context_tokens)
    for i, k in enumerate(drafts):
        if k and new[i] == k + 1:        # last token + k drafts: one decode row over all its keys
            new[i], ctx[i] = 1, ctx[i] + k
    rows = breakdown(BatchShape(new, ctx, batch.num_sampled))
    return (sum(v for key, v in whole.items() if key not in ATTENTION_KEYS)
            + sum(rows[key] for key in ATTENTION_KEYS))


def drafter_spec(method: str, target, draft_model=None) -> ModelSpec | None:
    """The network that drafts: a one-layer head of the target's shape, the draft model, or None."""
    if method in HEAD_METHODS:
        return replace(get_model(target), name=f"{get_model(target).name}-{method}-head", num_layers=1)
    if method == "draft_model":
        require(draft_model is not None, "speculative_config.model", draft_model, "draft_model needs a model")
        return get_model(draft_model)
    return None


@dataclass(frozen=True)
class ProposerCost:
    """Seconds the proposer adds to a step. `draft` prices one drafter pass (None for n-gram)."""

    method: str
    num_speculative_tokens: int
    draft: object | None = None
    draft_overhead_s: float = DRAFT_OVERHEAD_S
    ngram_fraction_of_step: float = NGRAM_FRACTION_OF_STEP
    tree_widths: tuple[int, ...] | None = None

    def __call__(self, batch: BatchShape, proposing_context: list[int], target_s: float,
                 drafts: list[int] | None = None) -> float:
        """Time to propose the next drafts of the rows that sampled (`proposing_context`: their
        tokens in KV after this step) after a target step of `target_s` seconds over `batch`
        (`drafts`: drafts verified per row; its first pass runs the same rows, priced likewise)."""
        m = len(proposing_context)
        if not m:
            return 0.0
        if self.draft is None:
            return self.ngram_fraction_of_step * target_s
        first_batch = BatchShape(batch.num_new_tokens, batch.num_context_tokens, m)
        first = verify_step_time(self.draft, first_batch, drafts or [0] * batch.num_reqs)
        widths = self.tree_widths[:-1] if self.tree_widths else (1,) * (self.num_speculative_tokens - 1)
        passes = sum(self._pass(w, m, proposing_context) * widths.count(w) for w in set(widths))
        return self.draft_overhead_s + first + passes

    def _pass(self, width: int, m: int, context: list[int]) -> float:
        """One drafting pass over `width` tokens of each of `m` requests."""
        batch = BatchShape([width] * m, context, m * width)
        return verify_step_time(self.draft, batch, [width - 1] * m)


def proposer_kv_cache_blocks(target, gpu, drafter: ModelSpec | None, tensor_parallel_size: int = 1,
                             block_size: int = 16, gpu_memory_utilization: float = 0.9,
                             max_num_batched_tokens: int = 8192) -> int:
    """KV blocks when the drafter's weights and its own KV per token share the GPU with the target."""
    blocks = kv_cache_blocks(target, gpu, tensor_parallel_size, block_size, gpu_memory_utilization,
                             max_num_batched_tokens)
    if drafter is None:
        return blocks
    target_kv = kv_bytes_per_token(target, tensor_parallel_size) * block_size
    freed = blocks * target_kv - weight_bytes_per_gpu(drafter, tensor_parallel_size, gpu)
    per_block = target_kv + kv_bytes_per_token(drafter, tensor_parallel_size) * block_size
    require(freed > 0, "speculative_config.model", drafter.name,
            "the drafter's weights leave no room for the KV cache")
    return int(freed // per_block)
