"""Plots render for a small run and a sweep table; the progress line draws from a fake clock."""
import io

import pandas as pd
import pytest
from matplotlib.figure import Figure

from sim import SimulationConfig, simulate
from sim.plots import PLOTS, plot_throughput_latency, save_plots
from sim.api.progress import Progress


@pytest.fixture(scope="module")
def results():
    return simulate(SimulationConfig().replace(workload={"num_requests": 40, "rate": 10.0}))


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_each_plot_has_labelled_axes(results, name):
    fig = PLOTS[name](results)
    assert isinstance(fig, Figure)
    for ax in fig.axes:
        if ax.has_data():
            assert ax.get_xlabel() or ax.get_title()


def test_save_plots_png_and_svg(results, tmp_path):
    png = save_plots(results, tmp_path, "png")
    svg = save_plots(results, tmp_path, "svg")
    assert len(png) == len(svg) == len(PLOTS)
    assert all(p.stat().st_size > 5000 for p in png)
    assert png[0].read_bytes()[:4] == b"\x89PNG"


def test_throughput_latency_from_a_sweep_table(tmp_path):
    sweep = pd.DataFrame({"rate": [1, 2, 4, 1, 2, 4], "policy": ["a"] * 3 + ["b"] * 3,
                          "p99_ttft_ms": [50, 80, 900, 40, 60, 300], "median_ttft_ms": [20, 30, 200, 20, 25, 90],
                          "p99_tpot_ms": [10, 12, 30, 11, 13, 20], "median_tpot_ms": [8, 9, 15, 8, 9, 12]})
    fig = plot_throughput_latency(sweep, hue="policy", slo={"p99_ttft_ms": 500})
    assert len(fig.axes) == 2 and fig.axes[0].get_ylabel() == "TTFT (ms)"
    fig.savefig(tmp_path / "sweep.png")


def test_progress_draws_only_after_interval():
    ticks = iter([0.0, 0.1, 0.7, 0.8, 1.5])
    stream = io.StringIO()
    progress = Progress(total=4, stream=stream, interval_s=0.5, clock=lambda: next(ticks))
    progress.update(1.0)
    assert stream.getvalue() == ""
    progress.update(2.0)
    assert "simulated       2.0 s | 2/4 requests done" in stream.getvalue()
    progress.update(3.0)
    progress.update(4.0)
    progress.close()
    assert stream.getvalue().endswith("4/4 requests done\n")


def test_progress_silent_on_short_runs():
    stream = io.StringIO()
    progress = Progress(stream=stream, clock=lambda: 0.0)
    for t in range(5):
        progress.update(float(t))
    progress.close()
    assert stream.getvalue() == ""


def test_plot_arguments_are_named_when_out_of_range(results):
    from kernels_cost_model.errors import ConfigError
    from sim.plots import plot_batch_composition, plot_timeline
    sweep = pd.DataFrame({"rate": [1, 2], "p99_ttft_ms": [10.0, 20.0]})
    with pytest.raises(ConfigError, match=r"metrics=\[\]: give at least one metric"):
        plot_throughput_latency(sweep, metrics=[])
    with pytest.raises(ConfigError, match=r"slo.p99_ttft_ms='5': must be a number > 0"):
        plot_throughput_latency(sweep, metrics=["p99_ttft_ms"], slo={"p99_ttft_ms": "5"})
    with pytest.raises(ConfigError, match=r"bins=0: must be an integer >= 1"):
        plot_batch_composition(results, bins=0)
    with pytest.raises(ConfigError, match=r"max_requests=1.5: must be an integer >= 1"):
        plot_timeline(results, max_requests=1.5)
    assert isinstance(plot_throughput_latency(sweep, metrics="p99_ttft_ms"), Figure)
