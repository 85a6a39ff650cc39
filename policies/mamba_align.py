"""vLLM's prefill chunks under Mamba "align" mode: a chunk ends where a state is to be cached.

With a state model's prefix caching in "align" mode (sim.core.kv_mamba_align) vLLM clips every prefill
chunk (0.33.0 vllm/v1/core/sched/scheduler.py `_mamba_block_aligned_split`, after the threshold, budget
and max_model_len caps, for running and waiting requests alike):
- a chunk that stops short of the prefill's end is cut back to a block boundary, unless that leaves
  nothing and a block is wider than the largest chunk (`max_num_batched_tokens`, or the threshold);
- it stops at the first of these strictly inside it: the next block boundary (a chunk starting mid-block),
  the last block boundary before the sequence's last token (its state is the last that can be cached),
  and the block-floored shared-prefix boundary of the request's lookup (the full-attention hit's end).
A chunk clipped to nothing is not scheduled: a running request is passed over, admissions stop.
"""
from __future__ import annotations


def aligned_chunk(kv, config, req, n: int, num_cached: int = 0) -> int:
    """`n` tokens for `req` (with `num_cached` new prefix hits) clipped as vLLM's align mode does;
    `n` unchanged where `kv` is not in align mode or the request is past its prefill."""
    block = getattr(kv, "checkpoint_tokens", 0)
    if not block:
        return n
    start = req.num_computed_tokens + num_cached
    prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1)
    if start >= prefill_end:
        return n
    end = start + n
    if end < prefill_end:
        largest = config.max_num_batched_tokens
        if config.long_prefill_token_threshold > 0:
            largest = min(largest, config.long_prefill_token_threshold)
        aligned = end // block * block
        if aligned > start or block <= largest:
            end = aligned
    junction = kv.shared_prefix_boundary(req)
    stops = ((start // block + 1) * block if start % block else 0,
             (req.num_tokens - 1) // block * block,
             start + (junction - start) // block * block if start < junction < end else 0)
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)
