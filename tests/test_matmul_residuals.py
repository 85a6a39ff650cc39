"""benchmarks/matmul_residuals.py: the slices of the held-out matmul error docs/cost_model.md quotes."""
from pathlib import Path

import numpy as np
import pytest

from kernels_cost_model.calibration import shipped_calibration
from tests.benchmark_loader import load_benchmark

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "kernel_profiles"
needs_data = pytest.mark.skipif(not PROFILES.is_dir(), reason="shared kernel profiles absent")
residuals = load_benchmark("matmul_residuals")


def _rows(ms, n, k, seconds):
    ms = np.asarray(ms, dtype=float)
    return {"m": ms, "n": np.full(len(ms), n), "k": np.full(len(ms), k), "t": np.asarray(seconds, dtype=float)}


def test_neighbours_read_a_power_law_exactly_and_stay_within_their_shape():
    fit = _rows([1, 4, 16, 64], 4096, 4096, [1e-5 * m ** 0.5 for m in (1, 4, 16, 64)])
    other = _rows([2, 8], 1024, 4096, [1.0, 1.0])   # another shape's rows never enter
    both = {c: np.concatenate([fit[c], other[c]]) for c in fit}
    held = _rows([2, 8, 32], 4096, 4096, [1e-5 * m ** 0.5 for m in (2, 8, 32)])
    assert residuals.neighbour_error(both, held) == pytest.approx(np.zeros(3), abs=1e-12)


def test_rate_spread_is_zero_when_every_k_runs_at_one_rate():
    ks = np.array([4096.0, 8192.0, 16384.0])
    rows = {"m": np.full(3, 4096.0), "n": np.full(3, 4096.0), "k": ks, "t": 2 * 4096 * 4096 * ks / 2e14}
    rate, spread = residuals.rate_spread(rows)
    assert rate == pytest.approx(np.full(3, 2e14)) and spread == pytest.approx(0.0, abs=1e-12)


@needs_data
def test_l40s_slices_as_documented():
    """docs/cost_model.md, "The L40S's matmul residuals": the shipped file's held-out error, the error
    above the ridge against below it, the neighbours' ceiling near 5 %, twice the H100's scatter."""
    l40s = residuals.report(PROFILES, "l40s")
    recorded = shipped_calibration("l40s").provenance["holdout_error"]["matmul"]["median_rel_err"]
    assert l40s["held"] == pytest.approx(recorded, rel=1e-9)
    assert l40s["above_ridge"] > 0.08 > 0.055 > l40s["below_ridge"]
    assert 0.045 < l40s["neighbours"] < 0.052 < l40s["held"]
    h100 = residuals.report(PROFILES, "h100-sxm")
    assert l40s["spread"] > 2 * h100["spread"]
