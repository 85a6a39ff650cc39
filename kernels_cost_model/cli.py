"""`servesim calibrate`: fit a GPU's roofline coefficients from a profile CSV or live torch measurements.

    servesim calibrate --backend profile --profile measured.csv --gpu h100 --out h100.json
    servesim calibrate --backend torch --device cpu --quick --out cpu.json

The torch backend writes its measurements next to the output (`<out>.profile.csv`) so the fit can be
reproduced with `--backend profile`. Both print the error per operator family on the fit and on a
deterministic held-out fifth of the shapes (fitted without them), then save a fit on all rows.
"""
from __future__ import annotations

import sys

import argparse
from pathlib import Path

from kernels_cost_model.errors import ConfigError

from .calibration import (Calibration, fit_profile, holdout_split, relative_errors,
                          save_calibration, uncalibrated)
from .hardware import get_gpu
from .profile_schema import read_profile, write_profile
from .roofline import FAMILIES, Coeffs


def add_calibrate_parser(subparsers) -> argparse.ArgumentParser:
    """Register `calibrate` on an argparse subparsers object; its handler returns an exit code."""
    p = subparsers.add_parser("calibrate", help="fit cost-model coefficients from measured kernels",
                              description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("profile", "torch"), default="profile",
                   help="profile: read --profile CSV; torch: measure kernels on --device now")
    p.add_argument("--profile", type=Path, help="measured profile CSV (schema: docs/cost_model.md)")
    p.add_argument("--device", default="cpu", help="torch backend device: cpu or cuda[:index]")
    p.add_argument("--model", default="", help="model whose shapes the torch backend measures (with --from-run "
                   "FILE: the served model)")
    p.add_argument("--gpu", default="", help="catalog GPU the fit is for (default: the profile's device, which"
                   " must then be a catalog GPU or cpu)")
    p.add_argument("--out", type=Path, help="calibration JSON to write (default calibration-<device>.json)")
    p.add_argument("--quick", action="store_true", help="torch backend: a small grid (well under a minute)")
    p.set_defaults(func=run_calibrate)
    return p


NON_GPU_DEVICES = ("cpu",)
"""Devices a fit may be for besides the catalog's GPUs (the torch backend's CPU)."""


def _fit_device(args, rows: list[dict]) -> str:
    """The device the fit is for: --gpu, else the profile's one device; a catalog GPU (or cpu), else a
    ConfigError listing the known GPUs."""
    devices = sorted({r["device"] for r in rows})
    device = args.gpu or (devices[0] if len(devices) == 1 else "")
    if not device:
        raise ConfigError("--gpu", None, f"profile mixes devices {devices}; pick one with --gpu")
    if device.lower() in NON_GPU_DEVICES:
        return device
    try:
        get_gpu(device)
    except ConfigError as exc:
        if args.gpu:
            raise ConfigError("--gpu", device, exc.reason) from None
        why = f"{exc.reason}; or name the GPU the fit is for with --gpu"
        raise ConfigError("profile device", device, why) from None
    return device


def _fallback(device: str) -> tuple[str, Calibration]:
    """Catalog GPU: its uncalibrated roofline fills unmeasured families. Otherwise they cost zero."""
    try:
        gpu = get_gpu(device)
    except ConfigError:
        return device, Calibration(device, {f: Coeffs(0.0, 0.0, 0.0) for f in FAMILIES},
                                   {"kind": "unmeasured families priced at zero"})
    return gpu.name, uncalibrated(gpu)


def _rows(args) -> list[dict]:
    if args.backend == "torch":
        from .torch_backend import measure_profile
        rows = measure_profile(args.model, args.device, quick=args.quick)
        return rows
    if args.profile is None:
        raise ConfigError("--profile", None, "the profile backend needs --profile CSV")
    return read_profile(args.profile)


def _report(title: str, errors: dict) -> None:
    print(title)
    for fam, e in errors.items():
        print(f"  {fam:18s} n={e['n']:6d}  median {100 * e['median_rel_err']:6.2f}%  "
              f"worst {100 * e['max_rel_err']:7.2f}%")


def _check_out(out: Path) -> None:
    """--out is a file path whose folder exists or can be made (made now, not after minutes of measuring)."""
    if out.is_dir():
        raise ConfigError("--out", str(out), "is a folder; give the calibration file's path")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("--out", str(out), f"cannot create its folder {out.parent}: {exc.strerror or exc}") from None


def run_calibrate(args) -> int:
    """Handler of `servesim calibrate`; 0 on success, 2 on a user error."""
    try:
        if args.out is not None:  # (before measuring or fitting anything)
            _check_out(Path(args.out))
        rows = _rows(args)
        devices = sorted({r["device"] for r in rows})
        device = _fit_device(args, rows)
        if args.gpu and len(devices) > 1:
            rows = [r for r in rows if r["device"] in (args.gpu, get_gpu(args.gpu).name)]
        name, fallback = _fallback(device)
        out = args.out or Path(f"calibration-{name.replace(':', '-')}.json")
        if args.backend == "torch":
            print("measured", len(rows), "kernels ->", write_profile(rows, out.with_suffix(".profile.csv")))
        fit_rows, held = holdout_split(rows)
        if fit_rows and held:
            check = fit_profile(fit_rows, name, fallback=fallback)
            _report("fit on 4/5 of shapes, error on them:", relative_errors(fit_rows, check))
            _report("held out (every 5th shape by rank, never fitted):", relative_errors(held, check))
        cal = fit_profile(rows, name, fallback=fallback)
        cal.provenance["profile"] = str(args.profile) if args.profile else f"torch backend on {args.device}"
        print("wrote", save_calibration(cal, out))
        return 0
    except ConfigError as exc:
        print(f"servesim: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (`python -m kernels_cost_model.cli calibrate ...`)."""
    parser = argparse.ArgumentParser(prog="servesim")
    add_calibrate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
