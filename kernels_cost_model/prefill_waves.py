"""Prefill attention as FlashAttention-2 schedules it: work units of 64 query rows, waves over the SMs.

vLLM runs prefill (and chunked-prefill) attention through FlashAttention-2's varlen entry point on GPUs
without FA3 (sm_80, sm_89, sm_120). With a paged KV cache that entry point always launches the split-KV
kernel with one split (`mha_varlen_fwd` calls `run_mha_fwd(params, stream, paged_KV)`; "only apply
split-k for decoding"), whose tile is fixed at 64 query rows (`run_mha_fwd_splitkv_dispatch`: kBlockM =
64, 128 threads) and whose grid is (query tiles, sequences, query heads) (vllm-project/flash-attention,
csrc/flash_attn/flash_api.cpp and src/flash_fwd_launch_template.h). Each work unit loops over the keys
its rows see: tile j of a chunk of c new tokens over p cached ones reads p + min(64 (j + 1), c) keys
(causal). A unit takes one SM (its 72-80 KB of shared memory leave no room for a second on the 100 KB
of sm_89/sm_120); the block scheduler hands units to SMs in grid order.

With no more units than SMs a launch lasts as long as its longest unit. With more, the SMs take units
in grid order as they free up (list scheduling): the launch ends between the moment the work spread
evenly over the SMs runs out and that plus the longest unit (Graham's bound); `path_keys` takes the
middle, work / SMs + longest / 2. Against an exact in-order list schedule of the units over a grid of
chunks, contexts, batches, heads and SM counts (108-188 SMs) this is within 0.3 % at the median and
7 % at the 90th percentile, and unlike a count of waves it never falls when a unit is added. LLMServingSim's
RTX 4090 rows show it plainly: at 16k cached keys a chunk of 16 to 256 tokens takes the same 520 us (32
heads x at most 4 tiles = 128 units, one wave on 128 SMs), 512 tokens twice that, 1024 four times.
The cost per key of this path is Coeffs.s_per_key (roofline.operator_keys); GPUs not listed keep the
longest row's keys (one unit per SM, the critical path alone).
"""
from __future__ import annotations

import math

#: Query rows of one FA2 split-KV work unit (kBlockM, fixed for every head size).
TILE_ROWS = 64


def key_block(head_dim: float) -> int:
    """Keys a unit loads per step (kBlockN of the split-KV kernel: 256 up to head size 80, 128 up to 128,
    else 64); a unit's keys are paid in whole blocks."""
    return 256 if head_dim <= 80 else (128 if head_dim <= 128 else 64)
#: GPUs whose vLLM prefill attention is FA2's split-KV kernel, with their SMs (one unit each) and source.
FA2_PREFILL_SMS: dict[str, tuple[int, str]] = {
    "l40s": (142, "NVIDIA L40S datasheet: 18,176 CUDA cores = 142 SMs x 128 (AD102); AIConfigurator's L40S "
                  "context attention kernel is FA2 for bf16 KV"),
    "rtx-4090": (128, "NVIDIA Ada Lovelace GPU Architecture whitepaper: GeForce RTX 4090, 128 SMs; vLLM 0.19 "
                      "FLASH_ATTN backend (FA2 on sm_89)"),
    "rtx-pro-6000": (188, "NVIDIA RTX PRO 6000 Blackwell datasheet: 24,064 CUDA cores = 188 SMs x 128; vLLM "
                          "FLASH_ATTN backend (FA2 on sm_120; FA3 needs sm_90)"),
}


def fa2_sms(gpu: str) -> int:
    """SMs that run FA2 prefill units on `gpu`, or 0 where its prefill kernel is not FA2's split kernel."""
    entry = FA2_PREFILL_SMS.get(gpu.split("@", 1)[0])
    return entry[0] if entry else 0


def sequence_units(chunk: float, context: float) -> tuple[int, float]:
    """(work units, keys summed over them) of one sequence's chunk per query head."""
    tiles = max(math.ceil(chunk / TILE_ROWS), 1)
    return tiles, tiles * context + TILE_ROWS * tiles * (tiles - 1) / 2.0 + chunk


def path_keys(units: float, unit_keys: float, longest: float, sms: int, block: int) -> float:
    """Keys one SM walks in a launch of `units` units holding `unit_keys` keys in all, the longest unit
    `longest` keys, on `sms` SMs, in whole blocks of `block` keys (see module docstring). Grows with
    every unit and key added, as a launch's time does."""
    top = math.ceil(longest / block) * block
    if units <= sms:
        return top
    spread = (unit_keys + units * block / 2.0) / sms  # every unit's keys, rounded up by half a block on average
    return max(top, spread + top / 2.0)


def row_path_keys(gpu: str, chunk: float, context: float, batch: float, heads: float, head_dim: float) -> float:
    """Path keys of a profile row (`batch` sequences of `chunk` new tokens over `context` cached keys):
    path_keys on an FA2 GPU, else the longest row's keys (context + chunk)."""
    sms = fa2_sms(gpu)
    if not sms:
        return context + chunk
    tiles, keys = sequence_units(chunk, context)
    return path_keys(tiles * batch * heads, keys * batch * heads, context + chunk, sms, key_block(head_dim))


def batch_path_keys(new: list[int], ctx: list[int], heads: float, sms: int, block: int) -> float:
    """Path keys of one varlen launch over a batch's prefill rows (> 1 new token; rows of `new` tokens
    over `ctx` cached ones), `heads` query heads each, on `sms` SMs in blocks of `block` keys."""
    units = keys = longest = 0.0
    for c, p in zip(new, ctx):
        if c > 1:
            tiles, k = sequence_units(c, p)
            units += tiles
            keys += k
            if c + p > longest:
                longest = c + p
    return path_keys(units * heads, keys * heads, longest, sms, block)
