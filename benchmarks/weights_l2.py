"""GEMM weights that AIConfigurator timed in L2, read from DRAM in serving (issue 14; kernels_cost_model/weights_l2.py).

    python benchmarks/weights_l2.py [--gpu l40s] [--model qwen2.5-0.5b --tp 1]

Per GPU with an AIConfigurator GEMM grid: the DRAM line (fitted over the grid shapes whose 6 weight copies
exceed the L2), the grid shapes whose copies fit (L2-resident in the benchmark) and how many of them serving
now prices slower, and their one-row rate (bytes / priced time of an m = 1 launch) in the benchmark state
against serving. Then, per (model, GPU, TP), the step time of decodes (1, 32, 256 requests at 1,024 cached
tokens) and of a 2,048-token prefill with the floor and without it. The same for the per-tensor FP8 GEMM
fits (modern_fit; one byte a weight element, so 6 copies fit up to twice the elements; rates in bytes
as the fits count them, 2 an element, so a weight-bound rate is twice the weight's own GB/s) and an FP8
model's steps. And for GPUs with datasheet figures only, whose GEMM shape keys are derived defaults (medians
of the calibrated GPUs' benchmark fits): residency judged by the largest L2 among the GPUs they come from
(derived_defaults.gemm_benchmark_device). Reads only the shipped calibrations.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_cost_model import make_cost_model  # noqa: E402
from kernels_cost_model.aiconfigurator_tables import SYSTEMS  # noqa: E402
from kernels_cost_model.batch import BatchShape  # noqa: E402
from kernels_cost_model.calibration import shipped_calibration, uncalibrated  # noqa: E402
from kernels_cost_model.derived_defaults import GEMM_BENCHMARK_KEY  # noqa: E402
from kernels_cost_model.hardware import get_gpu  # noqa: E402
from kernels_cost_model.modern_kernels import gemm_op, load_modern  # noqa: E402
from kernels_cost_model.operators import MatmulOp, matmul_operator  # noqa: E402
from kernels_cost_model.weights_l2 import dram_line, grid_shapes, one_row_bytes, weights_in_l2  # noqa: E402

MIB = 2**20
MATMULS = ("qkv", "o", "up", "down", "lm_head")
#: (model, GPU, TP) whose steps are shown by default: a small model and TP-split ranks.
CASES = (("qwen2.5-0.5b", "l40s", 1), ("llama-3.1-8b", "l40s", 4), ("llama-3.1-8b", "h100", 4),
         ("llama-3.1-8b", "rtx-pro-6000", 4), ("llama-3.1-8b", "b200", 8), ("llama-3.1-8b", "h100", 1),
         ("mistral-small-24b-fp8", "l40s", 4), ("mistral-small-24b-fp8", "h100", 4),
         ("mistral-small-24b-fp8", "b200", 8),
         ("qwen2.5-0.5b", "l4", 1), ("llama-3.1-8b", "l40", 4), ("llama-3.1-8b", "h100-pcie", 4),
         ("llama-3.1-8b", "a100-pcie-80gb", 4))
#: GPUs with datasheet figures only (derived defaults) reported by default.
UNCALIBRATED = ("a100-pcie-80gb", "h100-pcie", "h100-nvl", "l4", "l40", "rtx-5090", "mi300x")


def calibration_of(device: str):
    """The shipped calibration of `device`, else its derived defaults (calibration.uncalibrated)."""
    return shipped_calibration(device) or uncalibrated(get_gpu(device))


def benchmark_device(device: str) -> str | None:
    """The GPU whose L2 says which of `device`'s GEMM shapes were timed in L2 (itself where calibrated)."""
    return calibration_of(device).provenance.get(GEMM_BENCHMARK_KEY, device)


def fp8_table(device: str) -> dict | None:
    """The per-tensor FP8 GEMM fit of a GPU (modern_fit), or None."""
    fits = load_modern(device)
    return fits and fits["gemm"].get("fp8")


def fp8_operator(device: str, n: float, k: float) -> MatmulOp:
    """The FP8 GEMM of weight [k x n] as serving prices it (modern_kernels.gemm_op)."""
    return gemm_op(device, "fp8", MatmulOp(k * n, k + n, 0.0, 0.0, 0.0, 0.0), n, k)


def shape_rates(device: str, low: float = 0.0, high: float = float("inf"), fp8: bool = False) -> dict:
    """One-row rates (bytes/s) of the L2-resident grid shapes with `low` <= weight bytes <= `high` (`fp8`:
    of the FP8 fit, 1 byte a weight element)."""
    cal, timed_on = calibration_of(device), benchmark_device(device)
    table, element = (fp8_table(device), 1) if fp8 else (cal.coeffs, 2)
    bench, served = [], []
    for (n, k), c in grid_shapes(table).items():
        if weights_in_l2(timed_on, n, k, element) and low <= element * n * k <= high:
            nbytes = one_row_bytes(n, k)
            op = fp8_operator(device, n, k) if fp8 else matmul_operator(cal, "matmul", k, n)
            fit = dataclasses.replace(op, dram_s_per_byte=0.0, dram_extra_s=0.0)  # the benchmark state
            bench.append(nbytes / fit.time(1, 2))
            served.append(nbytes / op.time(1, 2))
    return {"bench": np.array(bench), "served": np.array(served)}


def report_gpu(device: str, fp8: bool = False) -> None:
    table = fp8_table(device) if fp8 else calibration_of(device).coeffs
    timed_on = benchmark_device(device)
    name = f"{device} fp8" if fp8 else device if timed_on == device else f"{device} (derived; {timed_on}'s L2)"
    line = table and timed_on and dram_line(table, timed_on, 1 if fp8 else 2)
    if not line:
        print(f"{name}: no GEMM grid with an L2 size; unchanged")
        return
    rates = shape_rates(device, fp8=fp8)
    raised = int(np.sum(rates["served"] < rates["bench"] * (1 - 1e-12)))
    print(f"{name}: DRAM line {line.overhead_s * 1e6:.2f} us + bytes at {1 / line.s_per_byte / 1e9:,.0f} GB/s; "
          f"{len(rates['bench'])} grid shapes L2-resident in the benchmark, {raised} priced slower in serving; "
          f"one-row rate median {np.median(rates['bench']) / 1e9:,.0f} -> {np.median(rates['served']) / 1e9:,.0f} GB/s")
    mid = shape_rates(device, 4 * MIB, 12 * MIB, fp8)
    if len(mid["bench"]):
        print(f"  weights of 4-12 MiB ({len(mid['bench'])} shapes): one-row rate median "
              f"{np.median(mid['bench']) / 1e9:,.0f} -> {np.median(mid['served']) / 1e9:,.0f} GB/s")


def without_floor(cm):
    """The cost model with every matmul at its shape's benchmark fit (the floor removed; a ShapedCostModel's,
    an FP8 model's, in its bases)."""
    if hasattr(cm, "prefill_base"):
        base = without_floor(cm.base)
        prefill = base if cm.prefill_base is cm.base else without_floor(cm.prefill_base)
        return dataclasses.replace(cm, base=base, prefill_base=prefill)
    ops = {name: dataclasses.replace(getattr(cm, name), dram_s_per_byte=0.0, dram_extra_s=0.0) for name in MATMULS}
    return dataclasses.replace(cm, **ops)


def step_times(cm) -> list[float]:
    batches = [BatchShape([1] * n, [1024] * n, num_sampled=n) for n in (1, 32, 256)]
    return [cm.step_time(b) for b in (*batches, BatchShape([2048], [0], num_sampled=1))]


def report_step(model: str, gpu: str, tp: int) -> None:
    cm = make_cost_model(model, gpu, tensor_parallel_size=tp)
    floored = [name for name in MATMULS if getattr(getattr(cm, "base", cm), name).dram_s_per_byte]
    before, after = step_times(without_floor(cm)), step_times(cm)
    cells = "  ".join(f"{b * 1e3:.3f} -> {a * 1e3:.3f} ({100 * (a / b - 1):+.1f} %)" for b, a in zip(before, after))
    print(f"{model} on {gpu}, TP {tp} (floored: {', '.join(floored) or 'none'}): decodes 1 / 32 / 256, "
          f"prefill 2,048 (ms): {cells}")


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="append", choices=sorted({*SYSTEMS.values(), *UNCALIBRATED}),
                        help="default: all")
    parser.add_argument("--model", help="one model's steps (with --tp) instead of the default cases")
    parser.add_argument("--tp", type=int, default=1)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for device in args.gpu or sorted(SYSTEMS.values()):
        report_gpu(device)
    for device in args.gpu or sorted(SYSTEMS.values()):
        report_gpu(device, fp8=True)
    for device in () if args.gpu else UNCALIBRATED:
        report_gpu(device)
    cases = [(args.model, gpu, args.tp) for gpu in (args.gpu or ["l40s"])] if args.model else CASES
    for model, gpu, tp in cases:
        report_step(model, gpu, tp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
