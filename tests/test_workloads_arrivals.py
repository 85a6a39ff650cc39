"""Arrival processes: rates, burstiness, time scaling, validation."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.errors import ConfigError
from workloads import (Constant, Gamma, Poisson, TraceTimes, arrival_times, diurnal, make_rng, piecewise,
                       rescale)

N = 200_000


def gap_stats(times):
    gaps = np.diff(np.concatenate([[0.0], times]))
    return gaps.mean(), gaps.std() / gaps.mean()


def test_poisson_mean_and_cv():
    mean, cv = gap_stats(Poisson(4.0).sample(make_rng(1, "poisson"), N))
    assert mean == pytest.approx(0.25, rel=0.01)
    assert cv == pytest.approx(1.0, abs=0.01)


@given(cv=st.floats(0.2, 4.0), rate=st.floats(0.1, 100.0))
def test_gamma_mean_and_cv(cv, rate):
    mean, got_cv = gap_stats(Gamma(rate, cv).sample(make_rng(2, "gamma"), N))
    assert mean == pytest.approx(1 / rate, rel=0.05)
    assert got_cv == pytest.approx(cv, rel=0.05)


def test_constant_is_evenly_spaced():
    times = Constant(2.0).sample(make_rng(0), 5)
    assert times.tolist() == [0.5, 1.0, 1.5, 2.0, 2.5]


def test_piecewise_rates_by_window():
    proc = piecewise([0, 100, 200], [1.0, 10.0, 0.0])
    times = arrival_times(proc, make_rng(3, "pw"), duration_s=300)
    counts = np.histogram(times, bins=[0, 100, 200, 300])[0]
    assert counts[0] == pytest.approx(100, abs=40)
    assert counts[1] == pytest.approx(1000, abs=120)
    assert counts[2] == 0
    assert np.all(np.diff(times) >= 0)


def test_piecewise_periodic_and_diurnal_mean_rate():
    periodic = piecewise([0, 50], [2.0, 6.0], period_s=100)
    assert len(arrival_times(periodic, make_rng(4), duration_s=10_000)) == pytest.approx(40_000, rel=0.03)
    day = diurnal(mean_rate=5.0, amplitude=0.8, period_s=1000)
    times = arrival_times(day, make_rng(5), duration_s=10_000)
    assert len(times) == pytest.approx(50_000, rel=0.03)
    peak = np.sum((times % 1000 < 100) | (times % 1000 > 900))
    trough = np.sum((times % 1000 > 400) & (times % 1000 < 600))
    assert peak > 3 * trough


def test_time_varying_count_mode_is_sorted_and_exact():
    times = diurnal(3.0, 0.5, 60).sample(make_rng(6), 1234)
    assert times.size == 1234 and np.all(np.diff(times) >= 0)


@given(target=st.floats(0.01, 1000.0), seed=st.integers(0, 2**16))
def test_time_scaling_hits_target_rate(target, seed):
    raw = np.sort(make_rng(seed, "trace").gamma(0.2, 5.0, size=500)) + 17.0
    times = TraceTimes(raw, target_rate=target).sample(make_rng(0), 500)
    assert times[0] == 0.0
    assert times.size / (times[-1] - times[0]) == pytest.approx(target, rel=1e-9)
    assert rescale(np.array([0.0]), target).tolist() == [0.0]


def test_duration_mode_stays_inside_window():
    times = arrival_times(Poisson(50.0), make_rng(7), duration_s=20.0)
    assert times.max() < 20.0 and len(times) == pytest.approx(1000, abs=150)


def test_same_seed_same_times():
    a = Gamma(3.0, 2.0).sample(make_rng(9, "x"), 100)
    b = Gamma(3.0, 2.0).sample(make_rng(9, "x"), 100)
    c = Gamma(3.0, 2.0).sample(make_rng(9, "y"), 100)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize("build, field", [
    (lambda: Poisson(0), "rate"), (lambda: Poisson(-1.0), "rate"), (lambda: Gamma(1.0, 0), "cv"),
    (lambda: Gamma(1.0, 1e-300), "cv"), (lambda: Gamma(1.0, 1e300), "cv"),  # (1 / cv^2 over- or underflows)
    (lambda: Constant(float("inf")), "rate"), (lambda: piecewise([1, 2], [1, 1]), "breakpoints_s"),
    (lambda: piecewise([0, 1], [0, 0]), "rates"), (lambda: diurnal(1.0, 1.5), "amplitude"),
    (lambda: TraceTimes([0.0, 2.0, 1.0]), "timestamps_s[2]"), (lambda: make_rng(-1), "seed"),
    (lambda: arrival_times(Poisson(1.0), make_rng(0)), "num_requests/duration_s"),
])
def test_bad_parameters_name_the_field(build, field):
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.field == field


def test_count_mode_fails_when_schedule_runs_dry():
    with pytest.raises(ConfigError, match="rate is 0 after 10"):
        piecewise([0, 10], [1.0, 0.0]).sample(make_rng(0), 1000)


def test_piecewise_and_trace_times_name_values_that_are_not_numbers():
    with pytest.raises(ConfigError, match=r"breakpoints_s='ab': must be a list of numbers"):
        piecewise("ab", [1, 2])
    with pytest.raises(ConfigError, match=r"rates=\['5', '5'\]: must be a list of numbers"):
        piecewise([0, 60], ["5", "5"])
    with pytest.raises(ConfigError, match=r"timestamps_s=nan: must be finite"):
        TraceTimes([0.0, float("nan")])
    with pytest.raises(ConfigError, match=r"seed=True: must be an integer >= 0"):
        make_rng(True, "workload")


def test_a_gamma_cv_out_of_range_points_to_an_arrival_process_that_exists():
    """The hint for evenly spaced arrivals names what the Python API has (there is no "constant" kind)."""
    with pytest.raises(ConfigError, match="workloads.Constant") as err:
        Gamma(rate=1.0, cv=1e-4)
    assert 'kind = "constant"' not in str(err.value)
    gaps = np.diff(Constant(4.0).sample(np.random.default_rng(0), 5))
    assert np.allclose(gaps, 0.25)
