"""Fit the decode-imbalance factor of vLLM's varlen attention from LLMServingSim's measured skew shots.

A batch of decodes whose contexts differ runs slower than the same batch at the mean context: the
kernel's tiles and SMs wait for the longest rows. LLMServingSim measured this on vLLM 0.19 (FA2) as
alpha = (t_skew - t_mean) / (t_max - t_mean) per batch (`tp<N>/skew.csv`, regime `pure` = decodes
only, `mixed` = decodes beside a prefill chunk). servesim measured the same on Hopper with
FlashAttention-3 (`benchmarks/fa3_paged_decode.py`, `kernels_cost_model/data/measured/<gpu>-fa3-skew.csv`).
This script takes, per GPU, regime and number of decodes n, the median alpha over every model (head
layout) and TP degree measured (clamped to [0, 1]) and writes `kernels_cost_model/data/decode_imbalance.csv`
with its source. Nothing here is fitted to a serving run.

    python benchmarks/fit_decode_imbalance.py [--profiles ../shared/data/kernel_profiles]
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_cost_model.attention_backend import read_skew_rows  # noqa: E402
from kernels_cost_model.gpu_calibration import MEASURED_DIR  # noqa: E402

#: LLMServingSim hardware folder -> our GPU name.
HARDWARE = {"RTXPRO6000": "rtx-pro-6000", "RTX4090": "rtx-4090"}
SOURCE = ("median alpha=(t_skew-t_mean)/(t_max-t_mean) over measured heterogeneous-decode shots, all models "
          "and TP degrees of {hw}: casys-kaist/LLMServingSim @5daddb21 profiler/perf/{hw}/*/*/bf16/tp*/skew.csv "
          "(vLLM 0.19, MIT)")
#: Hopper GPUs servesim measured itself (FlashAttention-3, the kernels vLLM runs there).
OWN = ("h100-sxm", "h200")
OWN_SOURCE = ("median alpha=(t_skew-t_mean)/(t_max-t_mean) over servesim's own FlashAttention-3 shots "
              "(fa3_fwd, KV contiguous per request; benchmarks/fa3_paged_decode.py, 2026-11-27): "
              "kernels_cost_model/data/measured/{gpu}-fa3-skew.csv")


def fit(profiles: Path) -> list[dict]:
    """Rows of the table: LLMServingSim's GPUs from `profiles`, then the Hopper GPUs servesim measured."""
    rows = []
    for hw, gpu in sorted(HARDWARE.items()):
        files = sorted((profiles / "llmservingsim" / hw).glob("*/*/bf16/tp*/skew.csv"))
        rows += median_rows(gpu, files, SOURCE.format(hw=hw))
        print(f"{gpu}: {len(files)} skew files")
    for gpu in OWN:
        rows += median_rows(gpu, [MEASURED_DIR / f"{gpu}-fa3-skew.csv"], OWN_SOURCE.format(gpu=gpu))
    return rows


def median_rows(gpu: str, files: list[Path], source: str) -> list[dict]:
    """One row per (regime, decodes): the median alpha over every shot of `files`, clamped to [0, 1]."""
    samples: dict[tuple[str, int], list[float]] = {}
    for path in files:
        for regime, n, alpha in read_skew_rows(path):
            samples.setdefault((regime, n), []).append(alpha)
    return [{"gpu": gpu, "regime": regime, "decodes": n, "alpha": f"{min(1.0, max(0.0, median(alphas))):.4g}",
             "samples": len(alphas), "source": source} for (regime, n), alphas in sorted(samples.items())]


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "kernel_profiles")
    ap.add_argument("--out", type=Path, default=ROOT / "kernels_cost_model" / "data" / "decode_imbalance.csv")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    rows = fit(args.profiles)
    if not rows:
        raise SystemExit(f"no skew.csv under {args.profiles}/llmservingsim")
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f" {r['gpu']:13s} {r['regime']:6s} n={r['decodes']:4d} alpha={r['alpha']:>7s} ({r['samples']} shots)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
