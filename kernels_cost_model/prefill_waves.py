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
    "a100-sxm-80gb": (108, "NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs; AIConfigurator's A100 "
                           "context attention kernel is vllm_flash_attn (FA2 on sm_80). Its 164 KB of shared "
                           "memory per SM could hold two units, but the measured rows fit one per SM better "
                           "(held-out 2.6 % against 2.7 % with two)"),
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


def sequence_units(chunk: float, context: float, block: int) -> tuple[int, float]:
    """(work units, keys summed over them, each rounded up to whole blocks of `block` keys) of one
    sequence's chunk of new tokens over `context` cached keys, per query head. Tile j < last reads
    context + 64 (j + 1) keys, the last context + chunk; the rounded tiles before the last repeat with
    period block / 64, so each residue class is an arithmetic series (a few steps, not one per tile)."""
    tiles = max(math.ceil(chunk / TILE_ROWS), 1)
    last = math.ceil((context + chunk) / block) * block
    period = block // TILE_ROWS
    base, rest = divmod(int(context), block)
    total = 0.0
    for i in range(1, period + 1):  # tiles k = i, i + period, ... (k = j + 1 <= tiles - 1)
        count = (tiles - 1 - i) // period + 1 if tiles - 1 >= i else 0
        first = base + math.ceil((rest + TILE_ROWS * i) / block)
        total += count * first + count * (count - 1) / 2.0
    return tiles, total * block + last


def path_keys(units: float, unit_keys: float, longest: float, sms: int) -> float:
    """Keys one SM walks in a launch of `units` units holding `unit_keys` keys in all (whole blocks), the
    longest unit `longest` (whole blocks), on `sms` SMs (see module docstring). Grows with every unit
    and key added, as a launch's time does."""
    if units <= sms:
        return longest
    return max(longest, unit_keys / sms + longest / 2.0)


def row_path_keys(gpu: str, chunk: float, context: float, batch: float, heads: float, head_dim: float) -> float:
    """Path keys of a profile row (`batch` sequences of `chunk` new tokens over `context` cached keys):
    path_keys on an FA2 GPU, else the longest row's keys (context + chunk)."""
    sms = fa2_sms(gpu)
    if not sms:
        return context + chunk
    block = key_block(head_dim)
    tiles, keys = sequence_units(chunk, context, block)
    return path_keys(tiles * batch * heads, keys * batch * heads, math.ceil((context + chunk) / block) * block, sms)


def batch_path_keys(new: list[int], ctx: list[int], heads: float, sms: int, block: int) -> float:
    """Path keys of one varlen launch over a batch's prefill rows (> 1 new token; rows of `new` tokens
    over `ctx` cached ones), `heads` query heads each, on `sms` SMs in blocks of `block` keys."""
    units = keys = longest = 0.0
    for c, p in zip(new, ctx):
        if c > 1:
            tiles, k = sequence_units(c, p, block)
            units += tiles
            keys += k
            if c + p > longest:
                longest = c + p
    return path_keys(units * heads, keys * heads, math.ceil(longest / block) * block, sms)
