"""Held-out accuracy of the shipped calibrations, and of the derived defaults on a GPU left out.

    python benchmarks/cost_model_accuracy.py [--profiles ../shared/data/kernel_profiles] [--gpu h100-sxm]
                                             [--torch-cpu]

1. Per calibrated GPU (kernels_cost_model/gpu_calibration.py lists them and their sources): median and
   worst relative error per family on the held-out split (every 5th distinct shape by rank, never seen
   by the fit), recomputed from the measurements and checked against the figure recorded in the file.
2. Leave one GPU out: derive the default efficiencies (derived_defaults.py) from every *other* calibrated
   GPU, price the left-out GPU from its datasheet peaks with them, and score all its held-out kernels.
   That is the error a user should expect on a GPU with no calibration: family-level defaults alone,
   and with the per-shape efficiencies of the same architecture.
`--torch-cpu` also measures this machine's CPU with the torch backend and scores it the same way.
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
from kernels_cost_model.gpu_calibration import SOURCES, device_of, device_rows, left_out_calibration  # noqa: E402
from kernels_cost_model.hardware import get_gpu  # noqa: E402
from kernels_cost_model.roofline import FAMILIES, OPTIONAL_FAMILIES, Coeffs  # noqa: E402

ALL = (*FAMILIES, *OPTIONAL_FAMILIES)


def errors(held: list[dict], cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    err = np.abs(predict(held, cal) / np.array([r["measured_s"] for r in held]) - 1.0)
    return err, np.array([r["family"] for r in held])


def held_out_table(device: str, held: list[dict], cal: Calibration) -> None:
    err, fams = errors(held, cal)
    recorded = cal.provenance.get("holdout_error", {})
    print(f"\n{device}: held-out error ({len(held)} kernels; {', '.join(cal.provenance.get('software', []))})")
    print(f"  {'family':20s} {'n':>6s} {'median':>8s} {'worst':>8s}  recorded median")
    for fam in ALL:
        sel = fams == fam
        if not sel.any():
            why = cal.provenance.get("unfitted_families", {}).get(fam, "no measurements")
            print(f"  {fam:20s} {'-':>6s}  {why}")
            continue
        rec = recorded.get(fam, {}).get("median_rel_err")
        same = "matches" if rec is not None and np.isclose(rec, np.median(err[sel])) else f"DIFFERS ({rec})"
        print(f"  {fam:20s} {sel.sum():6d} {100 * np.median(err[sel]):7.2f}% {100 * err[sel].max():7.2f}%  {same}")


def leave_one_gpu_out(helds: dict[str, list[dict]]) -> None:
    """Each GPU of `helds` scored at the defaults derived from every *other* shipped calibration (not
    only those of `helds`: a GPU picked alone still has its donors). Named variants (`<gpu>@<tag>`) are
    left out with their GPU and are not scored themselves."""
    helds = {d: h for d, h in helds.items() if device_of(d) == d}
    cals = {d: shipped_calibration(d) for d in SOURCES if device_of(d) == d}
    gpus = {d: get_gpu(d) for d in helds}
    print("\nleave one GPU out: defaults derived from the other calibrated GPUs, median held-out error")
    print(f"  {'GPU (architecture)':28s} " + " ".join(f"{f.replace('_attention', '_attn')[:16]:>17s}" for f in ALL))
    rows = {"family": [], "shape": []}
    for device, held in helds.items():
        for label, shapes in (("family", False), ("shape", True)):
            err, fams = errors(held, left_out_calibration(device, cals, shapes=shapes))
            medians = {f: float(np.median(err[fams == f])) for f in ALL if (fams == f).any()}
            rows[label].append(medians)
            cells = " ".join(f"{100 * medians[f]:16.1f}%" if f in medians else f"{'-':>17s}" for f in ALL)
            print(f"  {device + ' (' + gpus[device].architecture + ')':28s} {cells}  [{label} defaults]")
    for label, table in rows.items():
        scored = {f: [m[f] for m in table if f in m] for f in ALL}
        cells = " ".join(f"{100 * np.median(scored[f]):16.1f}%" if scored[f] else f"{'-':>17s}" for f in ALL)
        print(f"  {'median over GPUs':28s} {cells}  [{label} defaults]")


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "kernel_profiles")
    parser.add_argument("--gpu", action="append", choices=sorted(SOURCES), help="only these GPUs (default all)")
    parser.add_argument("--torch-cpu", action="store_true", help="also measure and score this CPU")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    print("hold-out rule:", HOLDOUT_RULE)
    if args.profiles.is_dir():
        helds = {}
        for device in args.gpu or sorted(SOURCES):
            _fit, helds[device] = holdout_split(device_rows(args.profiles, device))
            held_out_table(device, helds[device], shipped_calibration(device))
        leave_one_gpu_out(helds)
    else:
        print(f"no profiles at {args.profiles}: skipping the GPU tables")
    if args.torch_cpu:
        from kernels_cost_model.torch_backend import measure_profile
        rows = measure_profile(device="cpu", quick=False)
        fit, held = holdout_split(rows)
        cal = fit_profile(fit, "cpu", fallback=Calibration("cpu", {f: Coeffs(0, 0, 0) for f in FAMILIES}))
        held_out_table(f"cpu (torch backend, {rows[0]['source']})", held, cal)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
