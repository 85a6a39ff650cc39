"""Cross-check of the shipped two-GPU collective sweep against independent measurements of the same GPU.

The two-GPU replays price TP all-reduces with the NCCL sweep of `data/collective_curves.csv`
(LLMServingSim, 2x RTX PRO 6000 Server). AIConfigurator measured the same GPU on another host
(an 8-GPU RTX PRO 6000 Server node, 2 of its GPUs): nccl-tests' all-reduce (NCCL 2.29.2) and vLLM
0.24's own `tensor_model_parallel_all_reduce` in a CUDA graph (faster than NCCL below 8 MB and equal to
it above, as a custom all-reduce with vLLM's default 8 MB limit and its NCCL fallback would be). Comparing the three by message size tells which mechanisms
could make serving collectives slower than the sweep (docs/fidelity.md):

    python -m sim.fidelity.collective_check [../shared/data/kernel_profiles]
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from kernels_cost_model.aiconfigurator_tables import read_nccl, read_table
from kernels_cost_model.collectives import collective_curve

DEFAULT_PROFILES = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "kernel_profiles"
SYSTEM, GPU, RANKS = "rtx_pro_6000_server", "rtx-pro-6000", 2


@dataclass(frozen=True, slots=True)
class CollectivePoint:
    """One message size: the shipped sweep's time and the two AIConfigurator curves' at that size."""

    size_bytes: float
    sweep_s: float
    nccl_tests_s: float
    vllm_all_reduce_s: float


def _log_interp(points: list[tuple[float, float]], size: float) -> float:
    """Time at `size` between measured (bytes, seconds) points, linear in log(size); clamped at the ends."""
    points = sorted(points)
    if size <= points[0][0]:
        return points[0][1]
    for (s0, t0), (s1, t1) in zip(points, points[1:]):
        if size <= s1:
            w = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return t0 + w * (t1 - t0)
    return points[-1][1]


def compare(root: str | Path = DEFAULT_PROFILES) -> list[CollectivePoint]:
    """The shipped 2-rank all-reduce sweep beside AIConfigurator's two curves at the sweep's sizes; empty
    when the AIConfigurator tables are absent."""
    sweep = collective_curve(GPU, RANKS, "all_reduce")
    nccl = [(r["size_bytes"], r["measured_s"]) for r in read_nccl(root, SYSTEM) if r["ranks"] == RANKS]
    vllm = [(r["size_bytes"], r["measured_s"]) for r in read_table(root, SYSTEM, "all_reduce") if r["tp"] == RANKS]
    if sweep is None or not nccl or not vllm:
        return []
    return [CollectivePoint(size, sec, _log_interp(nccl, size), _log_interp(vllm, size))
            for size, sec in zip(sweep.sizes, sweep.seconds)]


def main(argv: list[str]) -> None:
    rows = compare(argv[0] if argv else DEFAULT_PROFILES)
    if not rows:
        print("AIConfigurator rtx_pro_6000_server comm tables not found")
        return
    print("bytes        sweep_us  nccl-tests_us (x sweep)  vllm_all_reduce_us (x sweep)")
    for p in rows:
        print(f"{p.size_bytes:>11,.0f}  {p.sweep_s * 1e6:8.1f}  {p.nccl_tests_s * 1e6:8.1f} ({p.nccl_tests_s / p.sweep_s:4.2f})"
              f"  {p.vllm_all_reduce_s * 1e6:8.1f} ({p.vllm_all_reduce_s / p.sweep_s:4.2f})")


if __name__ == "__main__":
    main(sys.argv[1:])
