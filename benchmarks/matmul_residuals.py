"""Where a shipped calibration's matmul error lies (issue 14): its held-out residuals, sliced.

    python benchmarks/matmul_residuals.py [--profiles ../shared/data/kernel_profiles] [--gpu l40s]

For one GPU's AIConfigurator GEMM table (bf16, the rows the calibration reads), with the shipped
coefficients: the median |error| on the fit and the held-out split; per held-out token count m, the
median |error| and signed error (+: priced slower than measured); the held-out rows above and below the
datasheet ridge (FLOPs per byte of the roofline, bf16 peak / memory bandwidth); the spread of the
achieved rate of large GEMMs (m >= 2,048, n and k >= 4,096), in all and across k at one (m, n); and a
ceiling no form smooth in m can beat by much: each held-out row read off its own shape's measured
neighbouring token counts (log-log interpolation of the measured times, no model).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_cost_model.aiconfigurator_tables import SYSTEMS, read_table  # noqa: E402
from kernels_cost_model.calibration import holdout_split, predict, shipped_calibration  # noqa: E402
from kernels_cost_model.hardware import get_gpu  # noqa: E402

SYSTEM_OF = {device: system for system, device in SYSTEMS.items()}


def residuals(profiles: Path, device: str) -> dict[str, dict[str, np.ndarray]]:
    """{"fit"|"held": {m, n, k, t (measured s), pred (s)}} of the device's GEMM table."""
    fit, held = holdout_split(list(read_table(profiles, SYSTEM_OF[device], "gemm")))
    cal = shipped_calibration(device)
    out = {}
    for name, rows in (("fit", fit), ("held", held)):
        cols = {c: np.array([r[c] for r in rows], dtype=float) for c in ("m", "n", "k")}
        out[name] = {**cols, "t": np.array([r["measured_s"] for r in rows]), "pred": predict(rows, cal)}
    return out


def neighbour_error(fit: dict, held: dict) -> np.ndarray:
    """|error| of each held-out row read off the measured times of its shape's fit rows (log-log in m)."""
    err = np.empty(len(held["t"]))
    for i in range(len(err)):
        same = (fit["n"] == held["n"][i]) & (fit["k"] == held["k"][i])
        order = np.argsort(fit["m"][same])
        lm, lt = np.log(fit["m"][same][order]), np.log(fit["t"][same][order])
        err[i] = abs(np.exp(np.interp(np.log(held["m"][i]), lm, lt)) / held["t"][i] - 1.0)
    return err


def rate_spread(rows: dict) -> tuple[np.ndarray, float]:
    """(achieved FLOP/s of the large GEMMs, std of log rate across k within one (m, n))."""
    big = (rows["m"] >= 2048) & (rows["n"] >= 4096) & (rows["k"] >= 4096)
    m, n = rows["m"][big], rows["n"][big]
    rate = 2.0 * m * n * rows["k"][big] / rows["t"][big]
    log_rate, dev = np.log(rate), np.empty(big.sum())
    for key in set(zip(m, n)):
        sel = (m == key[0]) & (n == key[1])
        dev[sel] = log_rate[sel] - np.median(log_rate[sel])
    return rate, float(np.std(dev))


def report(profiles: Path, device: str) -> dict[str, float]:
    res = residuals(profiles, device)
    fit, held = res["fit"], res["held"]
    signed = {s: r["pred"] / r["t"] - 1.0 for s, r in res.items()}
    gpu = get_gpu(device)
    out = {"fit": float(np.median(np.abs(signed["fit"]))), "held": float(np.median(np.abs(signed["held"])))}
    print(f"{device}: matmul median |error|, fit split {100 * out['fit']:.2f} %, held out {100 * out['held']:.2f} %"
          f" ({len(held['t'])} rows)")
    print(f"  {'m (held out)':>12s} {'rows':>5s} {'|error|':>8s} {'signed':>8s}")
    for m in np.unique(held["m"]):
        e = signed["held"][held["m"] == m]
        print(f"  {m:12.0f} {len(e):5d} {100 * np.median(np.abs(e)):7.2f}% {100 * np.median(e):+7.2f}%")
    intensity = held["m"] * held["n"] * held["k"] / (held["m"] * held["k"] + held["n"] * held["k"]
                                                     + held["m"] * held["n"])
    ridge = gpu.bf16_flops_per_s / gpu.hbm_bytes_per_s
    for label, sel in (("above", intensity > ridge), ("below", intensity <= ridge)):
        out[f"{label}_ridge"] = float(np.median(np.abs(signed["held"][sel])))
        print(f"  {label} the ridge ({ridge:.0f} FLOP/B): {sel.sum()} rows, {100 * out[f'{label}_ridge']:.2f} %")
    out["neighbours"] = float(np.median(neighbour_error(fit, held)))
    print(f"  held-out rows read off their shape's measured neighbours in m: {100 * out['neighbours']:.2f} %")
    rate, spread = rate_spread({c: np.concatenate([fit[c], held[c]]) for c in ("m", "n", "k", "t")})
    p10, p50, p90 = np.percentile(rate, [10, 50, 90]) / 1e12
    out["spread"] = spread
    print(f"  large GEMMs ({len(rate)}): {p10:.0f} / {p50:.0f} / {p90:.0f} TFLOP/s at p10 / median / p90 "
          f"(datasheet bf16 {gpu.bf16_flops_per_s / 1e12:.0f}); across k at one (m, n): std of log rate {spread:.3f}")
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "kernel_profiles")
    parser.add_argument("--gpu", action="append", choices=sorted(SYSTEM_OF), help="default: l40s")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.profiles.is_dir():
        print(f"no kernel profiles at {args.profiles}")
        return 1
    for device in args.gpu or ["l40s"]:
        report(args.profiles, device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
