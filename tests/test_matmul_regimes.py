"""kernels_cost_model/matmul_regimes.py: two rooflines per GEMM shape, their fit, files and pricing."""
import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.calibration import (Calibration, fit_profile, load_calibration, predict, save_calibration,
                                            shipped_calibration)
from kernels_cost_model.errors import ConfigError
from kernels_cost_model.matmul_regimes import (Regimes, blended, fit_batched, fit_regimes, picks, roofline_times,
                                               start_theta)
from kernels_cost_model.operators import MatmulOp, matmul_operator
from kernels_cost_model.power_cap import at_clocks
from kernels_cost_model.roofline import FAMILIES, Coeffs

GRID = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096)
LOW = Coeffs(2.0e-15, 1.0e-12, 4.0e-6, 16.0)    # a small-batch kernel: slow FLOPs, fast launch
HIGH = Coeffs(1.2e-15, 1.3e-12, 9.0e-6, 64.0)   # a large-tile kernel: fast FLOPs, slow launch


def _seconds(c: Coeffs, m, n=4096, k=4096):
    m = np.asarray(m, dtype=float)
    flops, nbytes = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
    return np.maximum(flops * c.s_per_flop * (1 + c.tile_rows / m), nbytes * c.s_per_byte) + c.overhead_s


def _sample(seconds, ms=GRID, n=4096, k=4096, scatter=0.02):
    """A shape's fit samples, with a measurement's scatter (fixed seed)."""
    m = np.asarray(ms, dtype=float)
    noise = 1.0 + scatter * np.random.default_rng(int(n)).standard_normal(len(m))
    return m, 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), np.asarray(seconds, dtype=float) * noise


def _knee_shape(p, ms=(1, 2, 8, 16, 64, 256, 1024, 4096), n=4096, k=4096, theta=(-32.0, -27.0, -11.0, 4.0)):
    """One shape's padded columns timed exactly by the smooth knee at `theta`."""
    m = np.asarray(ms, dtype=float)[None, :]
    cols = {"m": m, "F": 2.0 * m * n * k, "B": 2.0 * (m * k + k * n + m * n), "t": np.ones_like(m)}
    cols["t"], _ = roofline_times(np.array([theta]), cols, np.array([True]), p)
    return cols


@pytest.mark.parametrize("p", [np.inf, 3.0])
def test_batched_fit_recovers_the_times_it_was_made_from(p):
    cols = _knee_shape(p)
    start = np.array([[-31.5, -27.4, -10.5, 3.0]])
    theta = fit_batched(start, cols, np.ones_like(cols["t"]), np.array([True]), p)
    pred, _ = roofline_times(theta, cols, np.array([True]), p)
    assert pred / cols["t"] == pytest.approx(np.ones_like(pred), abs=2e-3)


def test_knee_is_the_roofline_at_inf_and_above_it_otherwise():
    sharp, soft = _knee_shape(np.inf)["t"], _knee_shape(3.0)["t"]
    a, b, o, tile = np.exp([-32.0, -27.0, -11.0, 4.0])
    m = np.array([1, 2, 8, 16, 64, 256, 1024, 4096], dtype=float)
    flops, nbytes = 2.0 * m * 4096 * 4096, 2.0 * (2 * m * 4096 + 4096 * 4096)
    assert sharp[0] == pytest.approx(np.maximum(flops * a * (1 + tile / m), nbytes * b) + o, rel=1e-12)
    assert (soft > sharp).all() and (soft < sharp * 2 ** (1 / 3)).all()


def test_a_shape_takes_another_option_only_where_its_cross_validation_wins_by_the_margin():
    nan = np.nan
    cv = [np.array([[0.10, nan], [0.10, nan], [0.10, 0.10]]),
          np.array([[0.095, nan], [0.05, nan], [nan, nan]])]  # wins by 5 %, by 50 %, has no rows
    assert list(picks(cv)) == [0, 1, 0]


def _priced(found: dict, key: str, start: Coeffs, ms, n=4096, k=4096) -> np.ndarray:
    """Seconds of the shape over `ms` as its regimes (or, unsplit, `start`) price them."""
    g = found.get(key)
    if g is None:
        return _seconds(start, ms, n, k)
    return np.array([g.time(_seconds(g.low, m, n, k), _seconds(g.high, m, n, k), m) for m in ms])


def test_two_kernels_split_where_they_switch():
    two = np.where(np.array(GRID) < 64, _seconds(LOW, GRID), _seconds(HIGH, GRID))
    start = Coeffs(1.5e-15, 1.1e-12, 6e-6, 32.0)
    g = fit_regimes({"matmul@4096x4096": _sample(two)}, {"matmul@4096x4096": start})["matmul@4096x4096"]
    assert (g.below, g.above) == (48.0, 64.0)
    assert g.low.s_per_flop == pytest.approx(LOW.s_per_flop, rel=0.1)
    assert g.high.s_per_flop == pytest.approx(HIGH.s_per_flop, rel=0.1)
    assert _priced({"k": g}, "k", start, GRID) / two == pytest.approx(np.ones(len(GRID)), abs=0.05)


def test_one_kernel_priced_as_measured_split_or_not():
    """The pick is a cross-validation over scattered rows, so one kernel may split by chance; either way
    the prices stay within the scatter of its times."""
    one = _seconds(LOW, GRID, n=2048)
    found = fit_regimes({"matmul@2048x4096": _sample(one, n=2048)}, {"matmul@2048x4096": LOW})
    assert _priced(found, "matmul@2048x4096", LOW, GRID, n=2048) / one == pytest.approx(np.ones(len(GRID)), abs=0.06)


def test_too_few_token_counts_on_a_side_never_split():
    ms = GRID[:7]
    two = np.where(np.array(ms) < 16, _seconds(LOW, ms), _seconds(HIGH, ms))
    assert fit_regimes({"matmul@4096x4096": _sample(two, ms)}, {"matmul@4096x4096": LOW}) == {}


@given(st.floats(0.5, 10_000.0), st.floats(1e-6, 1.0), st.floats(1e-6, 1.0))
def test_the_blend_lies_between_the_regimes_and_meets_each_at_its_grid_point(rows, low_s, high_s):
    t = blended(low_s, high_s, rows, 48.0, 64.0)
    assert min(low_s, high_s) * (1 - 1e-12) <= t <= max(low_s, high_s) * (1 + 1e-12)
    assert blended(low_s, high_s, 48.0, 48.0, 64.0) == low_s and blended(low_s, high_s, 64.0, 48.0, 64.0) == high_s
    if rows <= 48.0 or rows >= 64.0:
        assert t == (low_s if rows <= 48.0 else high_s)


def test_a_zero_overhead_blends_without_a_log():
    assert blended(0.0, 2e-6, math.sqrt(48.0 * 64.0), 48.0, 64.0) == pytest.approx(1e-6)


def _op(regimes=None, **floor):
    return MatmulOp(4096 * 4096, 8192, 1.5e-15, 1.1e-12, 6e-6, 32.0, 0.0, regimes=regimes, **floor)


def test_a_matmul_op_prices_the_regime_of_its_rows():
    g = Regimes(48.0, 64.0, LOW, HIGH)
    op = _op(g)
    for m, c in ((16, LOW), (48, LOW), (64, HIGH), (1024, HIGH)):
        assert op.time(m, 2) == pytest.approx(_seconds(c, m), rel=1e-12)
    middle = math.sqrt(48.0 * 64.0)   # halfway in log rows
    assert op.time(middle, 2) == pytest.approx(math.sqrt(_seconds(LOW, middle) * _seconds(HIGH, middle)), rel=1e-12)
    assert _op().time(1024, 2) == pytest.approx(_seconds(Coeffs(1.5e-15, 1.1e-12, 6e-6, 32.0), 1024), rel=1e-12)


def test_the_weight_floor_holds_in_both_regimes():
    """An L2-resident shape's weight read ends at the DRAM line's time whichever regime prices the rows
    (its extra seconds are set against the one-regime overhead, weights_l2.weight_floor)."""
    floor = {"dram_s_per_byte": 1e-11, "dram_extra_s": 1e-6}
    op = _op(Regimes(48.0, 64.0, LOW, HIGH), **floor)
    line = 2 * (8192 + 4096 * 4096) * 1e-11 + 1e-6 + op.overhead_s
    assert op.time(1, 2) == pytest.approx(line, rel=1e-12) and op.time(64, 2) == pytest.approx(line, rel=1e-12)
    assert _op(**floor).time(1, 2) == pytest.approx(line, rel=1e-12)


def test_scaled_scales_both_regimes_and_like_drops_them():
    op = _op(Regimes(48.0, 64.0, LOW, HIGH)).scaled(0.5, 0.5)
    assert op.regimes.low.s_per_flop == LOW.s_per_flop * 0.5 and op.regimes.high.s_per_byte == HIGH.s_per_byte * 0.5
    assert op.like(1024, 4096).regimes is None and op.like(1024, 4096).weight == 1024 * 4096


def test_grouped_launch_pays_one_overhead_of_its_regime():
    op = _op(Regimes(48.0, 64.0, LOW, HIGH))
    assert op.grouped(16, 2, 8) == pytest.approx((op.time(16, 2) - LOW.overhead_s) * 8 + LOW.overhead_s)
    assert op.grouped(128, 2, 8) == pytest.approx((op.time(128, 2) - HIGH.overhead_s) * 8 + HIGH.overhead_s)


def _calibration(regimes):
    coeffs = {f: Coeffs(1e-15, 1e-12, 5e-6) for f in FAMILIES}
    coeffs["matmul@4096x4096"] = Coeffs(1.5e-15, 1.1e-12, 6e-6, 32.0)
    return Calibration("h100-sxm", coeffs, {}, {}, regimes)


def test_regimes_survive_a_file_and_price_rows_and_operators(tmp_path):
    cal = _calibration({"matmul@4096x4096": Regimes(48.0, 64.0, LOW, HIGH)})
    back = load_calibration(save_calibration(cal, tmp_path / "cal.json"))
    assert back.regimes == cal.regimes
    row = {"family": "matmul", "operator": "matmul", "m": 16.0, "n": 4096.0, "k": 4096.0, "dtype_bytes": 2,
           "measured_s": 1.0, "chunk": 0.0, "context": 0.0, "batch": 0.0, "size_bytes": 0.0, "tp": 1}
    assert predict([row], back)[0] == pytest.approx(_seconds(LOW, 16), rel=1e-12)
    assert matmul_operator(back, "matmul", 4096, 4096).regimes == cal.regimes["matmul@4096x4096"]
    assert matmul_operator(back, "matmul", 4096, 3000).regimes is None   # off the grid: one regime


@pytest.mark.parametrize("bad, named", [({"below": 64, "above": 48, "low": {}, "high": {}}, "regimes.matmul@4096x4096"),
                                        ({"below": 48, "low": {}}, "regimes.matmul@4096x4096"),
                                        ({"below": 48, "above": 64, "low": 3, "high": {}}, "regimes.matmul@4096x4096")])
def test_a_malformed_regime_names_its_field(tmp_path, bad, named):
    path = save_calibration(_calibration({}), tmp_path / "cal.json")
    data = json.loads(path.read_text())
    data["regimes"] = {"matmul@4096x4096": bad}
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=named):
        load_calibration(path)


def test_sustained_clocks_slow_both_regimes_compute():
    cal = dataclasses.replace(shipped_calibration("h100-sxm"))
    assert cal.regimes, "the H100's calibration splits GEMM shapes"
    slowed, factor = at_clocks(cal, "h100-sxm", "sustained")
    key = next(iter(cal.regimes))
    assert factor > 1.0
    assert slowed.regimes[key].high.s_per_flop == pytest.approx(cal.regimes[key].high.s_per_flop * factor)
    assert slowed.regimes[key].low.s_per_byte == cal.regimes[key].low.s_per_byte


def test_fit_profile_can_leave_the_regimes_out():
    rows = [{"family": "matmul", "operator": "matmul", "m": float(m), "n": 4096.0, "k": 4096.0, "dtype_bytes": 2,
             "measured_s": float(t), "chunk": 0.0, "context": 0.0, "batch": 0.0, "size_bytes": 0.0, "tp": 1,
             "device": "h100-sxm", "source": "test"}
            for m, t in zip(GRID, np.where(np.array(GRID) < 64, _seconds(LOW, GRID), _seconds(HIGH, GRID)))]
    fallback = _calibration({})
    assert fit_profile(rows, "h100-sxm", fallback=fallback).regimes
    assert not fit_profile(rows, "h100-sxm", fallback=fallback, two_regimes=False).regimes


def test_start_theta_reads_the_tile_term_only_where_fitted():
    theta, tiled = start_theta([LOW, dataclasses.replace(HIGH, tile_rows=0.0)])
    assert list(tiled) == [True, False] and theta[0, 3] == pytest.approx(math.log(16.0))


A100 = shipped_calibration("a100-sxm-80gb")
A100_SPLIT = sorted(A100.regimes)


@given(st.sampled_from(A100_SPLIT), st.floats(1.0, 16384.0), st.floats(0.0, 16384.0))
def test_more_rows_cost_more_except_across_a_kernel_switch(key, rows, extra):
    """Each regime alone never gets cheaper with more rows; only between a switch's two grid points,
    where a faster kernel takes over (as the measured times do), may more rows cost less, and never less
    than the faster of the two kernels at the fewer rows."""
    n, k = (float(v) for v in key.split("@")[1].split("x"))
    op = matmul_operator(A100, "matmul", k, n)
    g, more = op.regimes, rows + extra
    if more <= g.below or rows >= g.above:
        assert op.time(more, 2) >= op.time(rows, 2)
    faster = min(dataclasses.replace(op, regimes=Regimes(g.below, g.above, c, c)).time(rows, 2)
                 for c in (g.low, g.high))
    assert op.time(more, 2) >= faster * (1 - 1e-12)
