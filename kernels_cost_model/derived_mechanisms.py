"""The measured attention mechanisms (attention_backend.py) for a GPU without its own rows, derived
from the GPUs with rows, as derived_defaults.py derives kernel efficiencies.

- Mixed-batch decode rates (FA2 drops GQA packing beside a prefill chunk): only a GPU whose attention
  kernels are FlashAttention 2 (`attention_kernels`) has the mechanism. Its rates are the median over
  the FA2 GPUs with rows of (rate / that GPU's datasheet DRAM bandwidth), times its own bandwidth.
  Other kernels (FA3 on Hopper, FlashInfer/TRT-LLM on sm_100) keep the plain roofline.
- Decode-imbalance alphas: per (regime, decodes), the median over the GPUs with rows in the same
  attention-kernel group (FA2: LLMServingSim's RTX GPUs; Hopper: servesim's own FA3 shots on the H100
  and H200). A group with no measured GPU gets none (alpha = 0): FlashInfer's tiling is neither's, and
  FA2's alphas priced FA3's skewed batches worse than none (benchmarks/fa3_paged_decode.py).

A GPU named `<gpu>@<tag>` (e.g. `rtx-pro-6000@uncalibrated`, sim/fidelity/replay.py) never takes `<gpu>`'s
own rows as a donor: that is the leave-one-GPU-out case. Each result names its donor GPUs.
"""
from __future__ import annotations

from functools import lru_cache
from statistics import median

from ._catalog import read_catalog
from .attention_backend import REGIMES, decode_imbalance, mixed_decode_s_per_byte
from .derived_defaults import attention_kernels
from .hardware import get_gpu


def _base(name: str) -> str:
    return name.split("@", 1)[0]


@lru_cache(maxsize=1)
def _mixed_rows() -> dict[str, dict[str, str]]:
    return {row["gpu"]: row for row in read_catalog("attention_backends.csv")}


@lru_cache(maxsize=1)
def _imbalance_gpus() -> tuple[str, ...]:
    return tuple(sorted({row["gpu"] for row in read_catalog("decode_imbalance.csv")}))


def _donors(gpus, gpu) -> list[str]:
    group = attention_kernels(gpu)
    return [d for d in gpus if d != _base(gpu.name) and attention_kernels(get_gpu(d)) == group]


def mixed_decode_for(gpu) -> tuple[tuple[float, float], tuple[str, ...]]:
    """((s/byte per query head, s/byte per KV head), donor GPUs) of a decode row in a mixed batch on
    `gpu`: its own row where it has one, else derived from the FA2 GPUs' rows; ((0, 0), ()) for a GPU
    whose kernels are not FA2 or where no other FA2 GPU was measured."""
    if gpu.name in _mixed_rows():
        return mixed_decode_s_per_byte(gpu.name), (gpu.name,)
    if attention_kernels(gpu) != "fa2":
        return (0.0, 0.0), ()
    donors = sorted(_donors(_mixed_rows(), gpu))
    if not donors:
        return (0.0, 0.0), ()

    def rate(column: str) -> float:
        per_bw = median(float(_mixed_rows()[d][column]) / get_gpu(d).hbm_bytes_per_s for d in donors)
        return per_bw * gpu.hbm_bytes_per_s

    return (1.0 / rate("mixed_decode_q_bytes_per_s"), 1.0 / rate("mixed_decode_kv_bytes_per_s")), tuple(donors)


def decode_imbalance_for(gpu) -> tuple[tuple | None, tuple[str, ...]]:
    """(attention_backend.decode_imbalance points, donor GPUs) for `gpu`: its own where measured, else
    per (regime, decodes) the median alpha over the measured GPUs of its attention-kernel group; (None, ())
    where that group has none."""
    own = decode_imbalance(gpu.name)
    if own is not None:
        return own, (gpu.name,)
    donors = sorted(_donors(_imbalance_gpus(), gpu))
    if not donors:
        return None, ()
    alphas: dict[tuple[str, int], list[float]] = {}
    for d in donors:
        for regime, points in zip(REGIMES, decode_imbalance(d)):
            for n, a in points:
                alphas.setdefault((regime, n), []).append(a)
    points = tuple(tuple(sorted((n, median(v)) for (r, n), v in alphas.items() if r == regime))
                   for regime in REGIMES)
    return points, tuple(donors)
