"""Held-out accuracy of the shipped cost-model calibrations against measured kernels.

    python benchmarks/cost_model_accuracy.py [--profiles ../shared/data/kernel_profiles] [--torch-cpu]

For each GPU with public measurements (Vidur's A100 and H100 profiles, MIT), refits on the fit split
(exactly how the shipped files were made), checks the result equals the shipped calibration, and
prints median and worst relative error per operator family and operator on the held-out split:
every 5th distinct shape by rank, never seen by the fit. `--torch-cpu` also measures this machine's
CPU with the torch backend (attention included) and reports its held-out errors the same way.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_cost_model.calibration import (HOLDOUT_RULE, Calibration, fit_profile, holdout_split,  # noqa: E402
                                            predict, shipped_calibration)
from kernels_cost_model.roofline import FAMILIES, Coeffs  # noqa: E402
from kernels_cost_model.vidur_profiles import fit_vidur_calibrations  # noqa: E402


def table(title: str, held: list[dict], cal: Calibration) -> None:
    err = np.abs(predict(held, cal) / np.array([r["measured_s"] for r in held]) - 1.0)
    fams = np.array([r["family"] for r in held])
    ops = np.array([r["operator"] for r in held])
    print(f"\n{title}")
    print(f"  {'family / operator':28s} {'n':>6s} {'median':>8s} {'worst':>8s}")
    for fam in FAMILIES:
        sel = fams == fam
        if not sel.any():
            print(f"  {fam:28s} {'-':>6s}  no measurements (uncalibrated default efficiencies)")
            continue
        print(f"  {fam:28s} {sel.sum():6d} {100 * np.median(err[sel]):7.2f}% {100 * err[sel].max():7.2f}%")
        for op in sorted(set(ops[sel])):
            s = sel & (ops == op)
            print(f"    {op:26s} {s.sum():6d} {100 * np.median(err[s]):7.2f}% {100 * err[s].max():7.2f}%")


def leave_one_model_out(profiles: Path) -> None:
    """Generalisation to a model never profiled: fit a GPU on its other models, score the one left out."""
    from kernels_cost_model.calibration import relative_errors, uncalibrated
    from kernels_cost_model.hardware import get_gpu
    from kernels_cost_model.vidur_profiles import read_vidur_compute
    rows = read_vidur_compute(profiles)
    print("\nleave-one-model-out (fit on the GPU's other models, score every kernel of the model left out):")
    for device in sorted({r["device"] for r in rows}):
        here = [r for r in rows if r["device"] == device]
        models = sorted({r["source"].split("/")[-2] for r in here})
        if len(models) < 2:
            continue
        for model in models:
            fit = [r for r in here if f"/{model}/" not in r["source"]]
            test = [r for r in here if f"/{model}/" in r["source"]]
            cal = fit_profile(fit, device, fallback=uncalibrated(get_gpu(device)))
            errs = relative_errors(test, cal)
            print(f"  {device:14s} {model:18s} " + "  ".join(
                f"{fam} median {100 * e['median_rel_err']:5.2f}% worst {100 * e['max_rel_err']:6.2f}%"
                for fam, e in errs.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "kernel_profiles")
    parser.add_argument("--torch-cpu", action="store_true", help="also measure and score this CPU")
    args = parser.parse_args()
    print("hold-out rule:", HOLDOUT_RULE)
    if args.profiles.is_dir():
        for device, (cal, held) in fit_vidur_calibrations(args.profiles).items():
            shipped = shipped_calibration(device)
            same = shipped is not None and all(
                np.isclose(getattr(shipped.coeffs[k], a), getattr(c, a), rtol=1e-6)
                for k, c in cal.coeffs.items() for a in ("s_per_flop", "s_per_byte", "overhead_s"))
            table(f"{device}: held-out error ({len(held)} kernels; shipped calibration "
                  f"{'matches this refit' if same else 'DIFFERS: rerun benchmarks/fit_shipped_calibration.py'})",
                  held, cal)
        leave_one_model_out(args.profiles)
    else:
        print(f"no profiles at {args.profiles}: skipping the GPU tables")
    if args.torch_cpu:
        from kernels_cost_model.torch_backend import measure_profile
        rows = measure_profile(device="cpu", quick=False)
        fit, held = holdout_split(rows)
        cal = fit_profile(fit, "cpu", fallback=Calibration("cpu", {f: Coeffs(0, 0, 0) for f in FAMILIES}))
        table(f"cpu (torch backend, {rows[0]['source']}): held-out error ({len(held)} kernels)", held, cal)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
