"""Plots a user can read: CDFs not squashed by one outlier, seconds for long latencies, legends off the
data, a Gantt window that shows the queueing, preemptions marked, sweeps plotted per axis with seeds
averaged, and `servesim sweep` writing its plots."""
import dataclasses

import matplotlib.colors
import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.patches import Rectangle

from sim import SimulationConfig, simulate
from sim.cli.main import main
from sim.plots import (plot_kv_occupancy, plot_latency_cdfs, plot_queue_length, plot_throughput_latency,
                       plot_timeline)


@pytest.fixture(scope="module")
def busy():
    """An overloaded run on a small KV cache: long queues and preemptions."""
    config = SimulationConfig().replace(workload={"num_requests": 200, "rate": 40.0},
                                        engine={"num_gpu_blocks": 1500, "max_model_len": 8192})
    return simulate(config)


def with_requests(results, **columns):
    requests = results.requests.copy()
    for name, values in columns.items():
        requests[name] = values
    return dataclasses.replace(results, requests=requests)


def draw(fig):
    FigureCanvasAgg(fig).draw()
    return fig


def test_cdf_panel_ends_at_p999_when_one_outlier_would_squash_it(busy):
    tpot = busy.requests["tpot_s"].copy()
    tpot.iloc[0] = 1000 * tpot.max()
    ax = plot_latency_cdfs(with_requests(busy, tpot_s=tpot)).axes[1]
    assert ax.get_xlim()[1] < tpot.iloc[0] * 1e3 / 10
    assert any("p99.9" in t.get_text() and "1 larger" in t.get_text() for t in ax.texts)


def test_long_latencies_are_drawn_in_seconds(busy):
    long = with_requests(busy, ttft_s=busy.requests["ttft_s"] + 20.0, queueing_s=busy.requests["queueing_s"] + 20)
    assert plot_latency_cdfs(long).axes[0].get_xlabel() == "TTFT (s)"
    assert "(s)" in plot_queue_length(long).axes[1].get_ylabel()
    assert plot_latency_cdfs(busy.with_slo()).axes[1].get_xlabel() == "TPOT (ms)"


def legend_outside(ax) -> bool:
    return ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1 - 1


def test_kv_legend_sits_beside_the_plot_not_on_the_100_percent_line(busy):
    ax = draw(plot_kv_occupancy(busy)).axes[0]
    assert busy.summary["num_preemptions"] > 0 and legend_outside(ax)


def test_timeline_shows_the_longest_queueing_and_marks_preemptions(busy):
    fig = draw(plot_timeline(busy, max_requests=50))
    ax = fig.axes[0]
    worst = busy.requests.loc[busy.requests["queueing_s"].idxmax(), "request_id"]
    shown = [t.get_text() for t in ax.get_yticklabels()]
    assert worst in shown and shown != list(busy.requests["request_id"].head(50))
    assert "longest queueing delay" in ax.get_title()
    outlined = [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()]
    preempted = busy.requests[busy.requests["request_id"].isin(shown) & (busy.requests["num_preemptions"] > 0)]
    assert len(outlined) == len(preempted) > 0
    assert legend_outside(ax)


def sweep_table() -> pd.DataFrame:
    """What run_sweep returns: axis columns with dotted names, several seeds, summary columns."""
    rows = []
    for seqs in (64, 256):
        for rate in (5.0, 10.0, 20.0):
            for seed in (0, 1, 2):
                p99 = rate * (10 if seqs == 64 else 5) + seed
                rows.append({"point": 0, "key": "k", "seed": seed, "replicas": 1, "router": "round_robin",
                             "workload.rate": rate, "engine.max_num_seqs": seqs, "median_ttft_ms": p99 / 2,
                             "p99_ttft_ms": p99, "median_tpot_ms": 10 + seed, "p99_tpot_ms": 20 + seed})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("x", ["workload.rate", "rate"])
def test_sweep_plot_takes_the_sweep_columns_and_averages_seeds(x):
    df = sweep_table()
    fig = draw(plot_throughput_latency(df, x=x, slo={"p99_ttft_ms": 500}))
    ttft = fig.axes[0]
    curves = [line for line in ttft.get_lines() if len(line.get_xdata()) > 2]
    assert len(curves) == 4  # 2 values of max_num_seqs x (median, p99); seeds averaged, not drawn apart
    for line in curves:
        assert np.all(np.diff(line.get_xdata()) > 0)  # no zig-zag
    mean_p99 = df[(df["engine.max_num_seqs"] == 64) & (df["workload.rate"] == 20.0)]["p99_ttft_ms"].mean()
    assert any(np.isclose(line.get_ydata()[-1], mean_p99) for line in curves)
    assert any("max_num_seqs=64" in line.get_label() for line in curves)
    assert ttft.get_ylim()[1] > 500 and legend_outside(ttft)
    assert ttft.get_xlabel() == "offered load (requests/s)"


def test_sweep_plot_labels_a_boolean_axis_true_false_not_1_0():
    df = pd.concat([sweep_table().assign(**{"engine.enable_chunked_prefill": on}) for on in (True, False)])
    labels = [line.get_label() for line in plot_throughput_latency(df, x="workload.rate").axes[0].get_lines()]
    assert any("enable_chunked_prefill=True" in label for label in labels)
    assert any("enable_chunked_prefill=False" in label for label in labels)


def test_sweep_throughput_panels_carry_their_unit():
    df = sweep_table().assign(request_throughput=1.0, output_throughput=100.0)
    fig = plot_throughput_latency(df, x="workload.rate", metrics=("request_throughput", "output_throughput"))
    assert [ax.get_ylabel() for ax in fig.axes] == ["request throughput (req/s)", "output throughput (tok/s)"]


def test_more_than_ten_lines_get_distinct_colours():
    df = pd.concat([sweep_table().assign(policy=f"p{i}") for i in range(12)])
    fig = plot_throughput_latency(df, x="workload.rate", metrics=("p99_ttft_ms",), hue="policy")
    colours = {matplotlib.colors.to_hex(line.get_color()) for line in fig.axes[0].get_lines()
               if len(line.get_xdata()) > 2}
    assert len(colours) == 12
    from sim.plots.capacity import attainment_vs_rate
    runs = pd.DataFrame([{"candidate": f"c{i}", "rate": r, "slo_attainment": 1.0, "num_requests": 10}
                         for i in range(12) for r in (1.0, 2.0)])
    lines = [l for l in attainment_vs_rate(runs).axes[0].get_lines() if l.get_label().startswith("c")]
    assert len({matplotlib.colors.to_hex(l.get_color()) for l in lines}) == 12


def test_sweep_plot_names_a_missing_column():
    with pytest.raises(ValueError, match="column 'speed' not in the table"):
        plot_throughput_latency(sweep_table(), x="speed")


def test_sweep_command_writes_plots(tmp_path, capsys):
    path = tmp_path / "sweep.toml"
    path.write_text('[deployment]\ncost_model = "linear"\n[workload]\nnum_requests = 15\nmax_tokens = 16\n'
                    "[sweep]\nseeds = [0, 1]\nrate = [5.0, 20.0]\nengine.max_num_seqs = [8, 64]\n")
    code = main(["sweep", "--config", str(path), "--out", str(tmp_path / "out"), "--executor", "serial",
                 "--no-progress"])
    assert code == 0
    assert {p.name for p in (tmp_path / "out" / "plots").iterdir()} == {"latency_vs_load.png",
                                                                       "throughput_vs_load.png"}


def test_a_sweep_of_one_axis_draws_without_a_legend_warning():
    """One line per panel and no SLO: nothing to put in a legend, and matplotlib is not asked for one."""
    import warnings
    df = sweep_table()[lambda t: t["engine.max_num_seqs"] == 64].drop(columns="engine.max_num_seqs")
    df = df.assign(request_throughput=1.0, request_goodput=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = draw(plot_throughput_latency(df, x="workload.rate", metrics=("request_throughput", "request_goodput")))
    assert all(ax.get_legend() is None or ax.get_legend().get_texts() for ax in fig.axes)
