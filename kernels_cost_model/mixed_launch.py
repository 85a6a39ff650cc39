"""Decode rows beside a prefill chunk in one FlashAttention-2 launch, as FA2 schedules them.

With a prefill chunk in the batch, vLLM's FA2 varlen launch (`mha_varlen_fwd`, paged KV: the split
kernel with one split, vllm-project/flash-attention csrc/flash_attn/flash_api.cpp) does not swap the
decodes' query heads into rows. Its grid is (ceil(max_seqlen_q / 64), sequences, query heads), x
fastest (`run_flash_splitkv_fwd`, src/flash_fwd_launch_template.h), a 64 x kBlockN tile per unit. So:

- each decode row is a unit per *query* head that computes a full 64-row tile over all its keys: it
  costs what a prefill unit of those keys costs (the prefill cost per path key), and the units run in
  waves over the SMs with the chunk's units;
- every decode sequence also launches ceil(longest chunk / 64) - 1 units that exit at once (their
  rows do not exist), each holding an SM for a moment (`EMPTY_UNIT_S`);
- the query heads of one KV head read the same K and V `stride` units apart in grid order (stride =
  the units of one head: decodes + the chunk's tiles). A later head shares the first one's DRAM read
  when it runs beside it (stride well under the SMs in flight) or when the data is still in L2 (one
  head's slice of K/V over all decodes small against the L2); otherwise it reads again (`dram_reads`);
- each wave of units pays a fixed cost (Q tile load, output store): `UNIT_WAVE_S`.

Kernel time = max(chunk bytes + decode DRAM bytes at `DRAM_EFFICIENCY` x the datasheet bandwidth, the
path of all units at the prefill cost per key + the fixed costs, the chunk alone as priced without
decodes), plus the launch overhead. The figures are fitted by a grid search on the fit split (every
5th distinct shape from the 3rd held out) of LLMServingSim's mixed launches (casys-kaist/LLMServingSim
profiler/perf/{RTXPRO6000,RTX4090}/*/attention.csv, vLLM 0.19, MIT: one chunk beside n decodes of one
context), both GPUs together (`benchmarks/fit_mixed_launch.py` prints the held-out errors).
"""
from __future__ import annotations

import math

#: Time an SM spends on a unit that exits at once (a decode row's query tiles past its one row);
#: 0.29-0.36 us per unit per SM read off the measured launches on both GPUs as the chunk grows.
EMPTY_UNIT_S = 0.35e-6
#: Fixed time per wave of units (Q tile load, output store), beyond its keys.
UNIT_WAVE_S = 1.0e-6
#: Share of the datasheet DRAM bandwidth the decodes' K/V re-reads stream at once they miss L2.
DRAM_EFFICIENCY = 0.95
#: Followers (the query heads of a KV head after the first) co-resident with their leader within
#: this x (stride / SMs) of it, in units of the window of SMs in flight.
PAIR_WINDOW = 1.15


def dram_reads(group: float, stride: float, sms: int, slice_bytes: float, l2: float) -> float:
    """Reads from DRAM of one decode's K/V per KV head: the first query head's, plus each later one's
    when it misses: min(1, PAIR_WINDOW x stride / SMs) of them run too far behind their leader to share
    its read, and of those the share of the slice (one KV head's K/V over all decodes) L2 cannot hold,
    min(1, slice / L2)."""
    late = min(1.0, PAIR_WINDOW * stride / sms)
    evicted = min(1.0, slice_bytes / l2)
    return 1.0 + (group - 1.0) * late * evicted


def fixed_s(waves: int, empty_units: float, sms: int) -> float:
    """Seconds of a mixed launch's fixed unit costs: each wave's, and the empty units' spread over the SMs."""
    return UNIT_WAVE_S * waves + EMPTY_UNIT_S * empty_units / sms


def mixed_path(pf_path: float, pf_keys: float, pf_tiles: float, pf_top: float, dec_keys: float,
               dec_top: float, n_dec: int, heads: float, sms: int) -> tuple[float, float]:
    """(path keys one SM walks, waves) of a launch of prefill units (`pf_tiles` per head, `pf_keys`
    keys per head, the longest `pf_top`; their own path `pf_path`) and `n_dec` decode units per head
    (`dec_keys` in all, the longest `dec_top`): (waves - 1) units of the mean then the longest, never
    below the prefill's own path or one decode unit."""
    units = heads * (pf_tiles + n_dec)
    waves = math.ceil(units / sms)
    top = pf_top if pf_top > dec_top else dec_top
    path = (waves - 1) * heads * (pf_keys + dec_keys) / units + top
    return max(path, pf_path, dec_top), waves
