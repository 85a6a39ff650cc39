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
in grid order as they free up: one sequence's units take ceil(units / SMs) waves, priced as (waves - 1)
units of their mean length then the longest (the last wave ends on it); against an exact in-order list
schedule of the units over a grid of chunks, contexts, batches, heads and SM counts (108-188 SMs) this is
within 0.2 % at the median and 4.5 % at the 90th percentile. A launch of several sequences takes the
longest such path, or all its units' keys spread over the SMs plus half the longest unit where that is
longer (the middle of Graham's bounds for list scheduling, which AIConfigurator's batched causal rows
follow): a price that never falls when a unit is added (a count of waves over the mean length of the
whole launch would, when a short unit lowers the mean). LLMServingSim's
RTX 4090 rows show it plainly: at 16k cached keys a chunk of 16 to 256 tokens takes the same 520 us (32
heads x at most 4 tiles = 128 units, one wave on 128 SMs), 512 tokens twice that, 1024 four times.
The path is the launch's compute: on these GPUs a prefill's FLOPs are priced through it alone (its cost
per key, Coeffs.s_per_key, roofline.operator_keys), not also through a FLOP rate (shape_keys.kernel_cost),
so every FA2 GPU's fit has the same form and its figures carry over to another FA2 GPU (derived
defaults, scaled by each GPU's per-SM peak: key_scale). GPUs not listed keep the longest row's keys
(one unit per SM, the critical path alone) beside a FLOP rate.
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
    "a100-sxm-40gb": (108, "NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs (as a100-sxm-80gb)"),
    "a100-pcie-40gb": (108, "NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs (as a100-sxm-80gb)"),
    "a100-pcie-80gb": (108, "NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs (as a100-sxm-80gb)"),
    "a10g": (80, "NVIDIA A10G (AWS G5): 10,240 CUDA cores = 80 SMs x 128 (GA102, sm_86: FA2)"),
    "l4": (58, "NVIDIA L4 datasheet: 7,424 CUDA cores = 58 SMs x 128 (AD104, sm_89: FA2)"),
    "l40s": (142, "NVIDIA L40S datasheet: 18,176 CUDA cores = 142 SMs x 128 (AD102); AIConfigurator's L40S "
                  "context attention kernel is FA2 for bf16 KV"),
    "rtx-4090": (128, "NVIDIA Ada Lovelace GPU Architecture whitepaper: GeForce RTX 4090, 128 SMs; vLLM 0.19 "
                      "FLASH_ATTN backend (FA2 on sm_89)"),
    "rtx-pro-6000": (188, "NVIDIA RTX PRO 6000 Blackwell datasheet: 24,064 CUDA cores = 188 SMs x 128; vLLM "
                          "FLASH_ATTN backend (FA2 on sm_120; FA3 needs sm_90)"),
}


#: Per-SM peak the FA2 GPUs' cost per path key is scaled to when it is carried to another GPU (derived
#: defaults): a unit's keys take the same work on every FA2 GPU, at its SM's share of the peak FLOP rate.
PER_SM_REFERENCE_FLOPS = 1e12


def key_scale(gpu) -> float:
    """s_per_key of `gpu`'s FA2 prefill x this = s_per_key at PER_SM_REFERENCE_FLOPS per SM (1 elsewhere)."""
    sms = fa2_sms(gpu.name)
    return gpu.bf16_flops_per_s / sms / PER_SM_REFERENCE_FLOPS if sms else 1.0


def fa2_sms(gpu: str) -> int:
    """SMs that run FA2 prefill units on `gpu`, or 0 where its prefill kernel is not FA2's split kernel."""
    entry = FA2_PREFILL_SMS.get(gpu.split("@", 1)[0])
    return entry[0] if entry else 0


def _floor_sum(n: int, r: int) -> int:
    """sum(m // r for m in range(n + 1))."""
    q, t = divmod(n, r)
    return r * q * (q - 1) // 2 + q * (t + 1)


def sequence_units(chunk: float, context: float, block: int) -> tuple[int, float]:
    """(work units, keys summed over them, each rounded up to whole blocks of `block` keys) of one
    sequence's chunk of new tokens over `context` cached keys, per query head. Tile j < last reads
    context + 64 (j + 1) keys, the last context + chunk; with context = q·block + s and r = block / 64,
    tile j's blocks are q + ceil((s + 64 (j + 1)) / block) = q + floor((a + j + 1) / r), a = floor((s +
    block - 1) / 64), a sum of floors in closed form."""
    tiles = max(math.ceil(chunk / TILE_ROWS), 1)
    base, rest = divmod(int(context), block)
    r = block // TILE_ROWS
    a = (rest + block - 1) // TILE_ROWS
    early = tiles - 1
    blocks = early * base + _floor_sum(a + early, r) - _floor_sum(a, r) + math.ceil((context + chunk) / block)
    return tiles, float(blocks * block)


def sequence_path(tiles: int, keys: float, longest: float, heads: float, sms: int) -> float:
    """Keys one SM walks for one sequence's units (`tiles` per head, `keys` in all per head, the longest
    `longest`) alone on `sms` SMs: the longest unit while one wave holds them, else (waves - 1) units of
    the mean length then the longest (the last wave ends on it)."""
    units = tiles * heads
    if units <= sms:
        return longest
    return (math.ceil(units / sms) - 1) * keys / tiles + longest


def path_keys(seq_path: float, unit_keys: float, top: float, sequences: float, sms: int) -> float:
    """Keys one SM walks in a launch of `sequences` sequences: the longest path of one sequence alone
    (`seq_path`, the max of sequence_path); with several, at least all units' keys (`unit_keys`) spread
    over the SMs plus half the longest unit `top` (the SMs free up unevenly at the end: between none and
    a whole unit, Graham's bound). Never falls when a unit, a key or a sequence is added."""
    if sequences <= 1:
        return seq_path
    spread = unit_keys / sms + top / 2.0
    return spread if spread > seq_path else seq_path


def row_path_keys(gpu: str, chunk: float, context: float, batch: float, heads: float, head_dim: float) -> float:
    """Path keys of a profile row (`batch` sequences of `chunk` new tokens over `context` cached keys):
    path_keys on an FA2 GPU, else the longest row's keys (context + chunk)."""
    sms = fa2_sms(gpu)
    if not sms:
        return context + chunk
    block = key_block(head_dim)
    tiles, keys = sequence_units(chunk, context, block)
    top = math.ceil((context + chunk) / block) * block
    return path_keys(sequence_path(tiles, keys, top, heads, sms), keys * heads * batch, top, batch, sms)


def batch_path_keys(new: list[int], ctx: list[int], heads: float, sms: int, block: int) -> float:
    """Path keys of one varlen launch over a batch's prefill rows (> 1 new token; rows of `new` tokens
    over `ctx` cached ones), `heads` query heads each, on `sms` SMs in blocks of `block` keys
    (sequence_units and sequence_path inlined: this runs once per engine step)."""
    keys = path = top = 0.0
    rows = 0
    r = block // TILE_ROWS
    for c, p in zip(new, ctx):
        if c > 1:
            tiles = -(-c // TILE_ROWS)
            base, rest = divmod(p, block)
            a = (rest + block - 1) // TILE_ROWS
            q1, t1 = divmod(a + tiles - 1, r)
            q0, t0 = divmod(a, r)
            last = -(-(p + c) // block)
            k = block * ((tiles - 1) * base + r * (q1 * (q1 - 1) - q0 * (q0 - 1)) // 2
                         + q1 * (t1 + 1) - q0 * (t0 + 1) + last)
            last *= block
            units = tiles * heads
            own = last if units <= sms else (-(-units // sms) - 1) * k / tiles + last
            keys += k
            rows += 1
            if own > path:
                path = own
            if last > top:
                top = last
    return path_keys(path, keys * heads, top, rows, sms)
