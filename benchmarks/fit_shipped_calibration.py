"""Rebuild kernels_cost_model/data/calibration/<gpu>.json from public kernel profiles.

    python benchmarks/fit_shipped_calibration.py [--profiles ../shared/data/kernel_profiles]

A100/H100: the Vidur profiles, read in place (never copied). RTX PRO 6000: the transcribed subset of
LLMServingSim's profiles in kernels_cost_model/data/profiles/. Fits on the deterministic fit split
only, so held-out errors are on kernels the fit never saw (printed, and kept in the file).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_cost_model.calibration import save_calibration  # noqa: E402
from kernels_cost_model.llmservingsim_profiles import fit_rtx_pro_6000_calibration  # noqa: E402
from kernels_cost_model.vidur_profiles import fit_vidur_calibrations  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "kernel_profiles")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "kernels_cost_model" / "data" / "calibration")
    args = parser.parse_args()
    fits = dict(fit_vidur_calibrations(args.profiles)) if args.profiles.is_dir() else {}
    cal, held = fit_rtx_pro_6000_calibration()
    fits[cal.device] = (cal, held)
    for device, (cal, _held) in fits.items():
        print("wrote", save_calibration(cal, args.out_dir / f"{device}.json"))
        for fam, e in cal.provenance["holdout_error"].items():
            print(f"  held out {fam:18s} n={e['n']:3d} median {e['median_rel_err'] * 100:5.1f}%"
                  f"  worst {e['max_rel_err'] * 100:5.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
