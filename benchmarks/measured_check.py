"""The shipped calibrations against servesim's own GPU measurements (kernels_cost_model/data/measured).

    python benchmarks/measured_check.py

Their matmuls and attention feed no calibration, so they are kernel measurements the fits have not
seen: cuBLAS through PyTorch, FlashAttention-2 through PyTorch, servesim's Triton paged decode, and
(`<gpu>-fa3.profile.csv`) FlashAttention-3's prefill, the kernel family vLLM runs on Hopper, over cached
contexts no table of vLLM's times; for it the script also prints how what a cached context adds to a
chunk is priced against what it adds to the kernel. Their
norms and activations (Inductor's) are what the H100's and H200's elementwise fits are made from, so
those rows show the fit's error over all its rows, held-out and fitted; `<gpu>-torch.unseen.profile.csv`,
where there is one, holds them at widths the fit never saw; `<gpu>-torch.tp-ranks.profile.csv` holds
matmuls and decode attention at the shapes of one rank of Llama-3.1-70B at TP 4 and 8. Prints, per GPU and operator (attention: per
head layout), the median |error| and the median signed error (positive: the calibration prices the kernel
slower than measured).
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels_cost_model.calibration import predict, shipped_calibration  # noqa: E402
from kernels_cost_model.gpu_calibration import MEASURED_DIR, measured_profile  # noqa: E402
from kernels_cost_model.profile_schema import read_profile  # noqa: E402

GPUS = ("h100-sxm", "h200")


def errors_by_group(gpu: str, path=None) -> dict[tuple, np.ndarray]:
    """(operator, KV heads or blank) -> signed relative errors of the shipped calibration on `gpu`'s
    profile (or the profile at `path`)."""
    rows = read_profile(path or measured_profile(gpu))
    signed = predict(rows, shipped_calibration(gpu)) / np.array([r["measured_s"] for r in rows]) - 1.0
    groups: dict[tuple, list] = defaultdict(list)
    for r, e in zip(rows, signed):
        heads = f"{int(r['num_heads'])}/{int(r['num_kv_heads'])}" if "attention" in r["family"] else ""
        groups[(r["family"], r["operator"], heads)].append(e)
    return {k: np.array(v) for k, v in groups.items()}


def profiles() -> list[tuple]:
    """(label, GPU, profile path or None: its own profile) of every profile to check."""
    unseen = [(gpu, MEASURED_DIR / f"{gpu}-torch.unseen.profile.csv") for gpu in GPUS]
    fa3 = [(gpu, MEASURED_DIR / f"{gpu}-fa3.profile.csv") for gpu in GPUS]
    ranks = [(gpu, MEASURED_DIR / f"{gpu}-torch.tp-ranks.profile.csv") for gpu in GPUS]
    return ([(gpu, gpu, None) for gpu in GPUS]
            + [(f"{gpu} (unseen widths)", gpu, path) for gpu, path in unseen if path.is_file()]
            + [(f"{gpu} (one rank of 70B at TP 4 and 8)", gpu, path) for gpu, path in ranks if path.is_file()]
            + [(f"{gpu} (FlashAttention-3 prefill)", gpu, path) for gpu, path in fa3 if path.is_file()])


def context_increments(gpu: str, path) -> tuple[np.ndarray, np.ndarray]:
    """Prefill rows of a profile over a cached context: (chunk, priced / measured - 1 of what the cached
    context adds to the same chunk over an empty cache). Where the calibration and the kernel differ by
    an amount per launch, this still compares how each grows with the cached keys."""
    rows = [r for r in read_profile(path) if r["operator"] == "prefill_attention"]
    priced = predict(rows, shipped_calibration(gpu))
    empty = {(r["num_heads"], r["num_kv_heads"], r["chunk"]): (p, r["measured_s"])
             for r, p in zip(rows, priced) if r["context"] == 0}
    chunks, errors = [], []
    for r, p in zip(rows, priced):
        base = empty.get((r["num_heads"], r["num_kv_heads"], r["chunk"]))
        if r["context"] and base:
            chunks.append(r["chunk"])
            errors.append((p - base[0]) / (r["measured_s"] - base[1]) - 1.0)
    return np.array(chunks), np.array(errors)


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    return argparse.ArgumentParser(description=__doc__.splitlines()[0])


def main(argv: list[str] | None = None) -> None:
    build_parser().parse_args(argv)
    print(f"{'gpu':9s} {'family':18s} {'operator':13s} {'heads':6s} {'n':>4s} {'|err| med':>9s} {'signed med':>10s}")
    for label, gpu, path in profiles():
        print(f"-- {label}")
        groups = errors_by_group(gpu, path)
        for (family, op, heads), e in sorted(groups.items()):
            print(f"{gpu:9s} {family:18s} {op:13s} {heads:6s} {len(e):4d} {100 * np.median(np.abs(e)):8.1f}% "
                  f"{100 * np.median(e):+9.1f}%")
        by_family: dict[str, list] = defaultdict(list)
        for (family, _op, _heads), e in groups.items():
            by_family[family].extend(e)
        for family, e in sorted(by_family.items()):
            print(f"{gpu:9s} {family:18s} {'(all)':13s} {'':6s} {len(e):4d} {100 * np.median(np.abs(e)):8.1f}% "
                  f"{100 * np.median(e):+9.1f}%")
        if path is not None and "fa3" in path.name:
            chunks, e = context_increments(gpu, path)
            for label, part in (("chunks < 512", e[chunks < 512]), ("chunks >= 512", e[chunks >= 512])):
                print(f"{gpu:9s} what a cached context adds, {label}: {len(part)} rows, median "
                      f"{100 * np.median(part):+.1f}% (p10 {100 * np.percentile(part, 10):+.1f}%, "
                      f"p90 {100 * np.percentile(part, 90):+.1f}%)")


if __name__ == "__main__":
    main()
