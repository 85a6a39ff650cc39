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


def test_the_held_out_figure_reads_each_shape_at_its_own_pick():
    nan = np.nan
    cv = [np.array([[0.10, nan], [0.10, nan]]), np.array([[0.095, nan], [0.05, nan]])]  # wins by 5 %, by 50 %
    held = [np.array([[0.2, 0.2], [0.2, 0.2]]), np.array([[0.0, 0.0], [0.01, 0.01]])]
    assert residuals.per_shape_pick(held, cv) == pytest.approx(np.median([0.2, 0.2, 0.01, 0.01]))


def test_two_regimes_blend_only_between_the_switch_neighbours():
    class Shapes:  # the low regime (fitted on the first rows) prices 1 s, the high one 4 s
        fit = {"m": np.array([[8.0, 16.0, 32.0, 64.0]])}

        def refit(self, mask, cols):
            return (1.0 if mask[0, 0] else 4.0) * np.ones_like(cols["m"])

    shapes = Shapes()
    cols = {"m": np.array([[8.0, 16.0, 20.0, 32.0, 64.0]])}
    mask = np.ones((1, 4))
    step, blend = residuals._two_regimes(shapes, 16.0, 32.0)(mask, cols)
    assert list(step[0]) == [1.0, 1.0, 1.0, 4.0, 4.0]
    assert list(blend[0][[0, 1, 3, 4]]) == [1.0, 1.0, 4.0, 4.0]
    assert blend[0][2] == pytest.approx(4.0 ** (np.log(20 / 16) / np.log(2)))


@needs_data
def test_smooth_knee_and_small_batches_as_documented():
    """docs/cost_model.md, "A smooth knee, tried": cross-validation picks a knee on the B60 that takes
    its held-out error under 5 %, and one on the A100 that takes it over; only the B60's small batches
    run slower than 16 rows."""
    b60, a100 = residuals.knee_report(PROFILES, "arc-pro-b60"), residuals.knee_report(PROFILES, "a100-sxm-80gb")
    assert b60["picked"] == 4.0 and b60["held"][4.0] < 0.045 < 0.05 < b60["held"][np.inf]
    assert a100["picked"] < np.inf and a100["held"][a100["picked"]] > 0.05 > a100["held"][np.inf]
    assert residuals.small_batch_ratios(PROFILES, "arc-pro-b60")[1.0] > 1.15
    assert all(abs(r - 1.0) < 0.04 for r in residuals.small_batch_ratios(PROFILES, "h100-sxm").values())


@needs_data
def test_two_regimes_as_documented():
    """docs/cost_model.md, "Two regimes per shape": most B60 shapes split, which takes its held-out error
    under 5 %, and blending the regimes between the switch's grid points takes it lower."""
    b60 = residuals.regimes_report(PROFILES, "arc-pro-b60")
    assert b60["blend"] < b60["step"] < 0.05 < b60["single"] and b60["split"] > 0.5
