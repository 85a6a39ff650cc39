"""What a speculative-decoding proposer costs: time per step and memory for its weights and KV.

The target's verification is priced by the step-time model itself (a row of 1 + k query tokens
over its context, with logits for every verified position). This module prices the proposer that
runs after it in the same step (vLLM V1 drafts in the model runner, right after sampling):

- "eagle", "eagle3", "mtp": a one-layer head of the target's shape. Its first pass reads the
  target's hidden states for every scheduled token (same rows as the target batch); then k - 1
  passes of one token per proposing request. Plus `draft_overhead_s` per step.
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

    def __call__(self, batch: BatchShape, proposing_context: list[int], target_s: float) -> float:
        """Time to propose the next drafts of the rows that sampled (`proposing_context`: their
        tokens in KV after this step) after a target step of `target_s` seconds over `batch`."""
        m = len(proposing_context)
        if not m:
            return 0.0
        if self.draft is None:
            return self.ngram_fraction_of_step * target_s
        first = self.draft.step_time(BatchShape(batch.num_new_tokens, batch.num_context_tokens, m))
        one = self.draft.step_time(BatchShape([1] * m, proposing_context, m))
        return self.draft_overhead_s + first + (self.num_speculative_tokens - 1) * one


def proposer_kv_cache_blocks(target, gpu, drafter: ModelSpec | None, tensor_parallel_size: int = 1,
                             block_size: int = 16, gpu_memory_utilization: float = 0.9,
                             max_num_batched_tokens: int = 8192) -> int:
    """KV blocks when the drafter's weights and its own KV per token share the GPU with the target."""
    blocks = kv_cache_blocks(target, gpu, tensor_parallel_size, block_size, gpu_memory_utilization,
                             max_num_batched_tokens)
    if drafter is None:
        return blocks
    target_kv = kv_bytes_per_token(target, tensor_parallel_size) * block_size
    freed = blocks * target_kv - weight_bytes_per_gpu(drafter, tensor_parallel_size)
    per_block = target_kv + kv_bytes_per_token(drafter, tensor_parallel_size) * block_size
    require(freed > 0, "speculative_config.model", drafter.name,
            "the drafter's weights leave no room for the KV cache")
    return int(freed // per_block)
