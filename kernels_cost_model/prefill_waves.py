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
from functools import lru_cache

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
    "a10": (72, "NVIDIA A10 datasheet: 9,216 CUDA cores = 72 SMs x 128 (GA102, sm_86: FA2)"),
    "rtx-3090": (82, "NVIDIA Ampere GA102 whitepaper: GeForce RTX 3090, 82 SMs (sm_86: FA2)"),
    "rtx-a6000": (84, "NVIDIA RTX A6000 datasheet: 10,752 CUDA cores = 84 SMs x 128 (GA102, sm_86: FA2)"),
    "l40": (142, "NVIDIA L40 datasheet: 18,176 CUDA cores = 142 SMs x 128 (AD102, sm_89: FA2)"),
    "rtx-5090": (170, "NVIDIA RTX Blackwell whitepaper: GeForce RTX 5090, 21,760 CUDA cores = 170 SMs x 128 "
                      "(sm_120: FA2; FA3 needs sm_90)"),
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


#: ... and the cost per decode path key, a unit streaming its keys, to this share of the memory bandwidth.
PER_SM_REFERENCE_BYTES = 1e10


def key_scale(gpu, family: str = "prefill_attention") -> float:
    """s_per_key of `gpu`'s FA2 attention x this = s_per_key at the reference per-SM peak (1 elsewhere):
    FLOP/s per SM for prefill (its units compute), memory bandwidth per SM for decode from DRAM (they
    stream it)."""
    sms = fa2_sms(gpu.name)
    if not sms:
        return 1.0
    if family == "decode_attention":  # from DRAM (the L2 benchmark state runs at its SMs' own rate)
        return gpu.hbm_bytes_per_s / sms / PER_SM_REFERENCE_BYTES
    return gpu.bf16_flops_per_s / sms / PER_SM_REFERENCE_FLOPS


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


def alike_path_keys(gpu: str, chunk: float, context: float, batch: float, heads: float, head_dim: float) -> float:
    """Path keys of a launch of `batch` alike sequences (a benchmark row) on an FA2 GPU: all its units
    in whole waves over the SMs, (waves - 1) units of the mean length then the longest (sequence_path
    over batch x heads). Exact for alike rows, where Graham's bound of path_keys, which serving keeps for
    rows of any lengths, prices a launch that fits in one wave at more than its longest unit."""
    block = key_block(head_dim)
    tiles, keys = sequence_units(chunk, context, block)
    return sequence_path(tiles, keys, math.ceil((context + chunk) / block) * block, heads * batch, fa2_sms(gpu))


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


# ---- decode: FA2's split-KV units ------------------------------------------------------------------
#
# A launch of decodes alone (one query token each) with more query heads than KV heads runs FA2's
# swapped layout: the query heads of a KV head become the rows of one unit per (sequence, KV head), and
# each sequence's keys are split so that the units fill the SMs (`num_splits_heuristic`, with 2 x SMs
# slots for its 128-thread blocks, at most 128 splits; vllm-project/flash-attention
# csrc/flash_attn/flash_api.cpp). The heuristic runs on the host at launch: eagerly (LLMServingSim's
# profiles, batches past the largest CUDA-graph size) at the launch's rows and longest row; in a served
# decode step replayed from a full CUDA graph, once at capture, at the capture size and max_model_len
# (vLLM's gpu_model_runner captures with max_seq_len = max_model_len); at replay the kernel cuts each
# sequence's own keys into that many splits (docs/cost_model.md). Each unit walks ceil(blocks / splits)
# key blocks; the SMs take the units in ceil(units / SMs) waves. With as many KV heads as query heads
# there is no swap and no split: a unit per (sequence, head) walks all its keys. With rows of different
# lengths the waves before the last run units of the mean length and the last ends on the longest (as
# a prefill sequence's waves, sequence_path), the mean row's keys cut into the same splits: exact when
# all rows are alike, as in the profiles.
# Decodes beside a prefill chunk are not swapped: they are 64-row units of the chunk's launch
# (mixed_launch.py), not this path.


@lru_cache(maxsize=65536)
def num_splits(work: int, slots: int, blocks: int, most: int = 128) -> int:
    """FA2's split count for `work` (sequence, KV head) units over `slots` block slots and `blocks` key
    blocks: 1 when the units nearly fill the slots, else the fewest splits whose waves are at least 0.85
    as full as the best (splits that leave the blocks per split unchanged skipped)."""
    if work >= 0.8 * slots:
        return 1
    most = min(most, slots, blocks)
    efficiency = []
    for s in range(1, most + 1):
        eligible = s == 1 or -(-blocks // s) != -(-blocks // (s - 1))
        waves = work * s / slots
        efficiency.append(waves / math.ceil(waves) if eligible else 0.0)
    best = max(efficiency, default=0.0)
    for s in range(1, most + 1):
        if efficiency[s - 1] > 0.0 and efficiency[s - 1] >= 0.85 * best:
            return s
    return 1


@lru_cache(maxsize=65536)
def decode_units(batch: float, blocks: int, heads: float, kv_heads: float, sms: int,
                 decided_at: tuple | None = None) -> tuple[int, int]:
    """(waves, key blocks one unit walks) of a launch of `batch` decodes alone whose longest holds
    `blocks` key blocks; `decided_at`: (rows, key blocks) the split count was decided at (a captured
    graph's capture size and max_model_len blocks), None = this launch's own. Splits past the longest
    row's last block hold no unit."""
    return decode_launch_units(batch, blocks, heads, kv_heads, sms, decided_at)[:2]


def decode_launch_units(batch: float, blocks: int, heads: float, kv_heads: float, sms: int,
                        decided_at: tuple | None = None) -> tuple[int, int, int]:
    """`decode_units` and the splits each row's keys are cut into (1 unswapped)."""
    if heads <= kv_heads:
        return math.ceil(batch * heads / sms), blocks, 1
    rows, at_blocks = decided_at if decided_at is not None else (batch, blocks)
    splits = num_splits(int(rows * kv_heads), 2 * sms, max(int(at_blocks), 1))
    per_unit = -(-blocks // splits)
    return math.ceil(int(batch * kv_heads) * -(-blocks // per_unit) / sms), per_unit, splits


def mean_unit_blocks(mean_keys: float, block: int, splits: int) -> int:
    """Key blocks a unit of the mean row walks: its blocks cut into `splits` (as the longest row's)."""
    return -(-max(math.ceil(mean_keys / block), 1) // splits)


def decode_path(batch: float, keys: float, heads: float, kv_heads: float, sms: int, block: int,
                decided_at: tuple | None = None, mean_keys: float | None = None) -> float:
    """Keys one SM walks in a launch of `batch` decodes alone whose longest reads `keys` keys and whose
    mean row reads `mean_keys` (default: as many): the waves before the last run units of the mean
    row, the last ends on the longest row's (see above; decode_units for the rest). Never shorter when
    a row reads more keys at the same waves."""
    blocks = max(math.ceil(keys / block), 1)
    waves, per_unit, splits = decode_launch_units(batch, blocks, heads, kv_heads, sms, decided_at)
    if waves == 1 or mean_keys is None:
        return float(waves * per_unit * block)
    return float(((waves - 1) * mean_unit_blocks(mean_keys, block, splits) + per_unit) * block)


def decode_splits(batch: float, keys: float, heads: float, kv_heads: float, sms: int, block: int) -> int:
    """FA2's split count of an eager launch of `batch` decodes alone whose longest reads `keys` keys
    (1 where the layout is not swapped: as many KV heads as query heads)."""
    if heads <= kv_heads:
        return 1
    return num_splits(int(batch * kv_heads), 2 * sms, max(math.ceil(keys / block), 1))


def decode_copies(batch: float, heads: float, kv_heads: float) -> int:
    """Copy kernels beside an FA2 decode launch: the swapped layout reshapes the query (batch, KV heads x
    groups) to (batch x groups, KV heads) through a transpose and the output back (`mha_varlen_fwd`,
    vllm-project/flash-attention csrc/flash_attn/flash_api.cpp); each is a copy unless the transpose is a
    view, as it is with one sequence or one KV head."""
    return 2 if heads > kv_heads and batch > 1 and kv_heads > 1 else 0
