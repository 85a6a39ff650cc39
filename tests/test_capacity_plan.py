"""Deployment search, plan.toml, prices, the capacity/sweep CLI and the plots."""
import argparse
import math
import sys

import matplotlib.colors

import pandas as pd
import pytest

from sim.cli.main import build_parser
from sim.cli.capacity import add_capacity_parser, add_sweep_parser, load_sweep, main, recommended
from sim.planning.capacity import CapacityTarget
from sim.plots.capacity import attainment_vs_rate, pareto_front, save_capacity_plots, throughput_latency
from sim.planning.deployments import search_deployments
from kernels_cost_model.errors import ConfigError
from sim.planning.plan import Plan
from sim.planning.pricing import load_prices, price_per_gpu_hour

TINY_PLAN = """
seed = 0
[deployment]
cost_model = "linear"
[engine]
num_gpu_blocks = 2048
max_model_len = 4096
[workload]
num_requests = 30
max_tokens = 32
rate = 10.0
[slo]
ttft_s = 0.5
[target]
rate = 10.0
ttft_p99_s = 0.5
[search]
gpus = ["h100", "a100"]
tensor_parallel_sizes = [1]
max_replicas = 8
seeds = [0]
rel_tol = 0.1
executor = "serial"
curve_points = [0.5, 1.0]
[prices]
h100 = 3.0
a100 = 2.0
"""


def write(tmp_path, text, name="plan.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return search_deployments(Plan.from_toml(write(tmp_path_factory.mktemp("plan"), TINY_PLAN)))


def test_search_ranks_by_cost_and_reports_headroom(report):
    table = report.table
    assert list(table["rank"]) == [1, 2] and table["feasible"].all()
    # the linear cost model ignores the GPU: same capacity, so the cheaper GPU wins
    assert table.iloc[0]["gpu"] == "a100" and table.iloc[0]["usd_per_hour"] <= table.iloc[1]["usd_per_hour"]
    assert (table["headroom"] >= 1).all() and (table["usd_per_million_output_tokens"] > 0).all()
    assert set(report.curves["candidate"]) == {"h100 TP1", "a100 TP1"}


def test_plots_are_written(report, tmp_path):
    paths = save_capacity_plots(report, tmp_path, CapacityTarget(ttft_p99_s=0.5), recommended(report.table))
    assert [p.name for p in paths] == ["throughput_latency.png", "slo_attainment.png", "cost_frontier.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert len(pareto_front(report.table)) >= 1


@pytest.mark.parametrize("edit, field", [
    (('gpus = ["h100", "a100"]', 'gpus = ["h100", "tpu-v9"]'), "deployment.gpu"),
    (("rate = 10.0\nttft", "rate = -1.0\nttft"), "target.rate"),
    (("seeds = [0]", "seeds = [0]\nbogus = 1"), "search.bogus"),
    (('gpus = ["h100", "a100"]', "gpus = []"), "search.gpus"),
])
def test_bad_plans_name_field_and_value(tmp_path, edit, field):
    with pytest.raises(ConfigError) as err:
        Plan.from_toml(write(tmp_path, TINY_PLAN.replace(*edit)))
    assert err.value.field == field


@pytest.mark.parametrize("edit, field, value", [
    (("rel_tol = 0.1", "rel_tol = 0.0"), "search.rel_tol", 0.0),
    (("rel_tol = 0.1", "rel_tol = -0.5"), "search.rel_tol", -0.5),
    (("rel_tol = 0.1", "rel_tol = nan"), "search.rel_tol", math.nan),
    (("rel_tol = 0.1", "rel_tol = 5.0"), "search.rel_tol", 5.0),
    (("rel_tol = 0.1", 'rel_tol = "5%"'), "search.rel_tol", "5%"),
    (("seeds = [0]", "seeds = 3"), "search.seeds", 3),
    (("seeds = [0]", "seeds = [true]"), "search.seeds", (True,)),
    (("seeds = [0]", "seeds = [1, 1]"), "search.seeds", (1, 1)),
    (("curve_points = [0.5, 1.0]", "curve_points = []"), "search.curve_points", ()),
    (("[slo]\nttft_s = 0.5\n[target]\nrate = 10.0\nttft_p99_s = 0.5",
      "[target]\nrate = 10.0\nmin_attainment = 0.9"), "target.min_attainment", 0.9),
    (("curve_points = [0.5, 1.0]", 'curve_points = "all"'), "search.curve_points", "all"),
    (("curve_points = [0.5, 1.0]", "curve_points = [-1.0, 0.5]"), "search.curve_points", (-1.0, 0.5)),
    (("curve_points = [0.5, 1.0]", "curve_points = [nan]"), "search.curve_points", (math.nan,)),
    (("rate = 10.0\nttft", 'rate = "5"\nttft'), "target.rate", "5"),
    (("rate = 10.0\nttft", "rate = inf\nttft"), "target.rate", math.inf),
    (("ttft_p99_s = 0.5", 'ttft_p99_s = "2s"'), "target.ttft_p99_s", "2s"),
    (("ttft_p99_s = 0.5", "ttft_p99_s = inf"), "target.ttft_p99_s", math.inf),
    (('gpus = ["h100", "a100"]', 'candidates = "h100"'), "search.candidates", "h100"),
    (('gpus = ["h100", "a100"]', 'candidates = ["h100"]'), "search.candidates", "h100"),
    (('gpus = ["h100", "a100"]', 'candidates = [{ gpu = "h100", tensor_paralel = 2 }]'),
     "search.candidates.tensor_paralel", 2),
])
def test_wrong_types_and_values_in_a_plan_are_named(tmp_path, edit, field, value):
    text = TINY_PLAN.replace(*edit)
    if "candidates" in edit[1]:
        text = text.replace("tensor_parallel_sizes = [1]\n", "")
    with pytest.raises(ConfigError) as err:
        Plan.from_toml(write(tmp_path, text))
    assert err.value.field == field and repr(err.value.value) == repr(value)


def test_a_price_for_an_unknown_gpu_names_the_prices_key():
    with pytest.raises(ConfigError) as err:
        load_prices(overrides={"h1000": 2.0})
    assert err.value.field == "prices.h1000" and err.value.value == 2.0 and "unknown GPU" in err.value.reason


@pytest.mark.parametrize("content, field, value", [
    ("gpu,usd_per_gpu_hour\nh100,-3\n", "usd_per_gpu_hour", "-3"),
    ("gpu,usd_per_gpu_hour\nh100,0\n", "usd_per_gpu_hour", "0"),
    ("gpu,usd_per_gpu_hour\nh100,abc\n", "usd_per_gpu_hour", "abc"), ("gpu,usd_per_gpu_hour\n,3\n", "gpu", None),
])
def test_a_price_file_row_is_checked_and_named_with_its_line(tmp_path, content, field, value):
    """A negative or zero price once gave negative or zero costs; text, a crash."""
    path = tmp_path / "prices.csv"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        load_prices(path)
    assert err.value.field == f"{path}:2: {field}" and (value is None or err.value.value == value)


@pytest.mark.parametrize("content, named", [
    (b"", "not a readable CSV file"), (b"\x00\xff\xfe", "not a readable CSV file"),
    (b"gpu,usd_per_gpu_hour\nh100,1\nh100-sxm,5\n", "prices this GPU a second time"),
])
def test_an_unreadable_or_repeating_price_file_is_named(tmp_path, content, named):
    path = tmp_path / "prices.csv"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=named):
        load_prices(path)
    with pytest.raises(ConfigError, match="is a folder"):
        load_prices(tmp_path)


def test_prices_have_sources_and_missing_price_is_named():
    table = load_prices()
    assert {"provider", "price_date", "source"} <= set(table.columns) and table["source"].notna().all()
    assert price_per_gpu_hour(table, "h100") > price_per_gpu_hour(table, "a100")
    with pytest.raises(ConfigError) as err:
        price_per_gpu_hour(table, "mi300x")
    assert err.value.field == "deployment.gpu" and err.value.value == "mi300x"


def test_example_plan_parses():
    plan = Plan.from_toml("examples/plan.toml")
    assert plan.target_rate == 20 and len(plan.candidates) == 3


def test_cli_sweep_writes_table_and_bad_config_exits_2(tmp_path, capsys):
    sweep = write(tmp_path, TINY_PLAN.split("[target]")[0] + "[sweep]\nseeds = [0, 1]\nrate = [2, 4]\n"
                  "engine.max_num_seqs = [8, 16]\n", "sweep.toml")
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(sweep), "--out", str(out), "--executor", "serial", "--no-progress"]) == 0
    assert (out / "sweep.csv").read_text().count("\n") == 9
    bad = write(tmp_path, TINY_PLAN.split("[target]")[0] + "[sweep]\nrate = [0]\n", "bad.toml")
    assert main(["sweep", "--config", str(bad), "--out", str(out)]) == 2
    assert "workload.rate" in capsys.readouterr().err
    assert main(["capacity", "--config", str(tmp_path / "missing.toml")]) == 2


@pytest.mark.parametrize("sweep, field, value", [
    ('[sweep]\nconfigs = "a"\n', "sweep.configs", "a"),
    ('[sweep]\nconfigs = ["a"]\n', "sweep.configs", ["a"]),
    ("[sweep]\nseeds = 3\nrate = [2]\n", "sweep.seeds", 3),
    ("[sweep]\nseeds = [true]\nrate = [2]\n", "sweep.seeds", [True]),
    ("[sweep]\nconfigs = [{workload = {rate = 5.0}}]\nrate = [5, 10]\n", "sweep.configs",
     [{"workload": {"rate": 5.0}}]),
])
def test_bad_sweep_tables_are_named(tmp_path, sweep, field, value):
    path = write(tmp_path, TINY_PLAN.split("[target]")[0] + sweep, "sweep.toml")
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.field == field and err.value.value == value
    if field == "sweep.configs" and "rate" in sweep:
        assert "cannot be combined with axes ['rate']" in err.value.reason


def test_a_sweep_that_is_not_a_table_shows_its_value(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_sweep(write(tmp_path, "sweep = 5\n" + TINY_PLAN.split("[target]")[0], "sweep.toml"))
    assert err.value.field == "sweep" and err.value.value == 5 and "must be a table" in err.value.reason


def test_sweep_progress_only_on_a_terminal_unless_asked(monkeypatch, tmp_path):
    from sim.cli import capacity
    calls = []
    monkeypatch.setattr("sim.planning.sweep.run_sweep", lambda *a, **kw: calls.append(kw["progress"]) or pd.DataFrame())
    monkeypatch.setattr(capacity, "load_sweep", lambda path: ([], [0]))
    for tty in (False, True):
        monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
        for flag in ([], ["--progress"], ["--no-progress"]):
            args = build_parser().parse_args(["sweep", "--config", "x.toml", "--no-plots", "--out", str(tmp_path),
                                              *flag])
            capacity.run_sweep_cmd(args)
    assert calls == [False, True, False, True, True, False]  # a log file gets no carriage-return bars


def test_a_capacity_from_runs_too_short_to_show_a_queue_says_so():
    from sim.cli.capacity import describe_recommended
    best = {"label": "h100 TP1 agg", "replicas": 1, "rate": 50.0, "low": 50.0, "high": 50.0, "seeds": 1,
            "usd_per_hour": 12.0}
    short = describe_recommended(best, 20.0, num_requests=150)
    assert "lasts only 3 s of arrivals" in short and "raise [workload] num_requests to 1500" in short
    assert "lasts only" not in describe_recommended(best, 20.0, num_requests=3000)


def test_a_capacity_no_rate_failed_is_a_lower_bound_and_says_so():
    """A target that held at every rate tried (doubling max_steps times) once read as a capacity found."""
    from sim.cli.capacity import describe_recommended
    from sim.planning.capacity import bracket_and_bisect, summarize_seeds
    lo, hi = bracket_and_bisect(lambda rate: True, 5.0, max_steps=3)
    result = summarize_seeds([{"seed": 0, "rate": lo, "fail_rate": hi, "runs": []}])
    assert (lo, hi) == (40.0, math.inf) and not result.bounded and str(result).startswith("at least 40 req/s")
    best = {"label": "h100 TP1 agg", "replicas": 1, "rate": lo, "low": lo, "high": lo, "seeds": 1,
            "usd_per_hour": 12.0, "bounded": False}
    text = describe_recommended(best, 20.0, num_requests=3000)
    assert "sustains at least 40 req/s" in text and "not a limit found" in text


def test_parsers_plug_into_any_subparsers():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    add_capacity_parser(sub)
    add_sweep_parser(sub)
    args = parser.parse_args(["sweep", "--config", "x.toml", "--executor", "ray", "--address", "auto"])
    assert args.address == "auto" and callable(args.func)


def test_engine_flag_grid_multiplies_candidates(tmp_path):
    text = TINY_PLAN.replace("[prices]", "[search.engine]\nmax_num_seqs = [8, 64]\nenable_chunked_prefill = [true]\n[prices]")
    plan = Plan.from_toml(write(tmp_path, text))
    labels = [c.label for c in plan.candidates]
    assert len(labels) == 4 and "a100 TP1 max_num_seqs=64 enable_chunked_prefill=True" in labels
    assert plan.candidates[1].config(plan.base).engine.max_num_seqs == 64
    bad = TINY_PLAN.replace("[prices]", "[search.engine]\nmax_num_seqs = [0]\n[prices]")
    with pytest.raises(ConfigError) as err:
        Plan.from_toml(write(tmp_path, bad))
    assert err.value.field == "engine.max_num_seqs"  # named by its TOML path


def test_a_tp_that_does_not_divide_the_heads_is_an_error_naming_the_candidate(tmp_path, capsys):
    text = TINY_PLAN.replace("[deployment]\n", '[deployment]\nmodel = "llama-3.1-70b"\n').replace(
        "tensor_parallel_sizes = [1]", "tensor_parallel_sizes = [1, 3]")
    with pytest.raises(ConfigError) as err:
        Plan.from_toml(write(tmp_path, text))
    assert "h100 TP3" in err.value.field and err.value.value == 3 and "num_heads=64" in err.value.reason
    assert main(["capacity", "--config", str(tmp_path / "plan.toml"), "--out", str(tmp_path / "o")]) == 2
    err_line = capsys.readouterr().err
    assert err_line.startswith("servesim: error: search candidate 'h100 TP3'") and err_line.count("\n") == 1


def test_a_roofline_plans_tp_that_does_not_divide_the_heads_is_named_as_the_candidate(tmp_path):
    """Under the roofline cost model (examples/plan.toml's) building the candidate's config failed first,
    so the error named deployment.tensor_parallel_size alone, not the candidate the README promises."""
    text = TINY_PLAN.replace('cost_model = "linear"', 'cost_model = "roofline"').replace("num_gpu_blocks = 2048\n", "")
    with pytest.raises(ConfigError) as err:
        Plan.from_toml(write(tmp_path, text.replace("tensor_parallel_sizes = [1]", "tensor_parallel_sizes = [1, 3]")))
    assert str(err.value).startswith("search candidate 'h100 TP3': deployment.tensor_parallel_size=3: must divide")


def test_latency_plot_is_against_offered_rate_with_tpot_bounds_and_capacity(report):
    best = recommended(report.table)
    target = CapacityTarget(ttft_p99_s=0.5, tpot_p99_s=0.001)
    fig = throughput_latency(report.curves, slo_ms={"ttft": 500, "tpot": 1}, capacity=best)
    ttft, tpot = fig.axes
    assert ttft.get_ylabel().startswith("TTFT") and tpot.get_ylabel().startswith("TPOT")
    for ax, bound in ((ttft, 500), (tpot, 1)):
        assert ax.get_xlabel() == "offered rate (req/s)" and ax.get_ylim()[1] > bound  # the bound is in view
        xs = {round(x, 6) for line in ax.get_lines() if line.get_marker() == "o" for x in line.get_xdata()}
        assert xs == {round(r, 6) for r in report.curves["rate"]}
        assert any("95% CI" in p.get_label() for p in ax.patches)
    assert target.as_slo() == {"ttft_s": 0.5, "tpot_s": 0.001}


def test_capacity_shading_takes_the_colour_of_the_recommended_candidates_line(report):
    best = recommended(report.table)
    fig = throughput_latency(report.curves, capacity=best)
    for ax in fig.axes:
        line = next(l for l in ax.get_lines() if l.get_label().endswith(f"candidate={best['label']}"))
        band = next(p for p in ax.patches if "95% CI" in p.get_label())
        assert matplotlib.colors.same_color(band.get_facecolor()[:3], line.get_color())


def test_attainment_plot_is_against_the_targets_bounds_and_zoomed(report):
    curves = report.curves
    assert (curves["slo_attainment"] < 1).any()  # the curve runs count requests within the target's bounds
    fig = attainment_vs_rate(curves, percentile=99, bounds="TTFT <= 500 ms")
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    admitted = curves["slo_attainment"] * curves["num_requests"] / (curves["num_requests"] - curves["num_rejected"])
    assert low <= min(admitted.min(), 0.99) and low > 0.5 and high <= 1.01
    assert 0.99 in [line.get_ydata()[0] for line in ax.lines]


TINY_CURVES = pd.DataFrame({"candidate": ["x", "x"], "rate": [1.0, 2.0], "seed": [0, 0],
                            "p99_ttft_ms": [10.0, 20.0], "p99_tpot_ms": [1.0, 2.0]})


def test_capacity_prints_the_recommended_capacity_interval(tmp_path, capsys):
    code = main(["capacity", "--config", str(write(tmp_path, TINY_PLAN)), "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0 and "capacity_95ci" in out
    assert "recommended: a100 TP1 x" in out and "(one seed, so no 95% interval: add seeds" in out
    assert "- (1 seed)" in out and "over 1 seeds" not in out  # one seed has no spread to show
    best = {"label": "x", "rate": 5.0, "low": 5.0, "high": 5.0}
    labels = lambda cap: {p.get_label() for p in throughput_latency(TINY_CURVES, capacity=cap).axes[0].patches}
    assert labels({**best, "seeds": 1}) == {"x: capacity 5 req/s\n(one seed: no 95% CI)"}
    assert labels({**best, "seeds": 3}) == {"x: capacity 5 req/s\n(95% CI 5 to 5)"}
