"""Rebuild kernels_cost_model/data/calibration/<gpu>.json and data/derived_defaults.json from public kernels.

    python benchmarks/fit_shipped_calibration.py [--profiles ../shared/data/kernel_profiles] [--gpu h100-sxm]

Every GPU with measured kernels (kernels_cost_model/gpu_calibration.py lists the sources): AIConfigurator's
vLLM tables, LLMServingSim's vLLM 0.19 profiles and Vidur's profiles, all read in place (never copied).
Fits on the deterministic fit split only, so the held-out errors (printed, and kept in each file) are on
kernels the fit never saw. Takes over an hour on one core (per-shape matmul fits, each with a 5-fold
cross-validation of its tile term and of its two regimes, matmul_regimes.py: about 9 minutes for a GPU
whose GEMM table has 59 token counts per shape); `--gpu` fits one GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_cost_model.calibration import save_calibration, shipped_calibration  # noqa: E402
from kernels_cost_model.derived_defaults import derive_defaults  # noqa: E402
from kernels_cost_model.hardware import get_gpu  # noqa: E402
from kernels_cost_model.gpu_calibration import SOURCES, device_of, fit_all  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "kernel_profiles")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "kernels_cost_model" / "data")
    parser.add_argument("--gpu", action="append", choices=sorted(SOURCES),
                        help="fit only these GPUs (the derived defaults are then not rewritten)")
    parser.add_argument("--defaults-only", action="store_true",
                        help="only rederive data/derived_defaults.json from the shipped calibrations")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.defaults_only:
        cals = {d: shipped_calibration(d) for d in SOURCES if device_of(d) == d}
        write_defaults(derive_defaults(cals, {d: get_gpu(d) for d in cals}), args.out_dir)
        return 0
    if not args.profiles.is_dir():
        print(f"no kernel profiles at {args.profiles}")
        return 1
    fits, defaults = fit_all(args.profiles, args.gpu)
    for device, (cal, _held) in fits.items():
        print("wrote", save_calibration(cal, args.out_dir / "calibration" / f"{device}.json"))
        for fam, e in cal.provenance["holdout_error"].items():
            print(f"  held out {fam:18s} n={e['n']:6d} median {e['median_rel_err'] * 100:5.1f}%"
                  f"  worst {e['max_rel_err'] * 100:6.1f}%")
    if not args.gpu:
        write_defaults(defaults, args.out_dir)
    return 0


def write_defaults(defaults: dict, out_dir: Path) -> None:
    path = out_dir / "derived_defaults.json"
    path.write_text(json.dumps(defaults, sort_keys=True, separators=(",", ":")) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    raise SystemExit(main())
