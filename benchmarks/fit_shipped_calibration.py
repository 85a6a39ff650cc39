"""Rebuild kernels_cost_model/data/calibration/<gpu>.json from the public Vidur profiles.

    python benchmarks/fit_shipped_calibration.py [--profiles ../shared/data/kernel_profiles]

Fits on the deterministic fit split only, so benchmarks/cost_model_accuracy.py measures error on
kernels the fit never saw. The raw profiles are read in place, never copied.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_cost_model.calibration import save_calibration  # noqa: E402
from kernels_cost_model.vidur_profiles import fit_vidur_calibrations  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "kernel_profiles")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "kernels_cost_model" / "data" / "calibration")
    args = parser.parse_args()
    for device, (cal, _held) in fit_vidur_calibrations(args.profiles).items():
        print("wrote", save_calibration(cal, args.out_dir / f"{device}.json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
