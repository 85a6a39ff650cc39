"""Fuzz: configs through the CLI (TOML file -> `servesim run --out`) and through `simulate()`.

Every drawn config either exits 2 with one named-error line, or completes with invariants checked
every step, no request lost, all KV free, and its saved tables loading back identical.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_configs import TRACE_TEXT, configs, expected_requests, hostile
from fuzz_harness import TALLY, assert_clean, check_tables, run_cli, toml_text
from kernels_cost_model.errors import ConfigError
from sim import SimulationConfig, simulate
from sim.api.results import Results
from workloads.errors import TraceFormatError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # rejections, uncalibrated GPUs: expected here


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trace") / "small.csv"
    path.write_text(TRACE_TEXT)
    return str(path)


@given(data=st.data())
def test_fuzzed_config_files_run_or_name_the_error(trace_path, tmp_path_factory, data):
    config = data.draw(configs(trace_path).flatmap(hostile))
    folder = tmp_path_factory.mktemp("run")
    (folder / "setup.toml").write_text(toml_text(config))
    code, _, err = run_cli("run", "--config", str(folder / "setup.toml"), "--out", str(folder / "out"),
                           "--format", data.draw(st.sampled_from(("csv", "parquet"))), "--plot-format", "none",
                           "--json", "--no-progress")
    assert_clean(code, err)
    if code == 0:
        check_tables(Results.load(folder / "out"), expected_requests(config))


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(data=st.data())
def test_fuzzed_configs_through_simulate_raise_only_named_errors(trace_path, tmp_path_factory, data):
    config = data.draw(configs(trace_path).flatmap(hostile))
    TALLY["runs"] += 1
    try:
        results = simulate(SimulationConfig.from_dict(config))
    except (ConfigError, TraceFormatError) as exc:
        assert str(exc) and type(exc)(*exc.args).args == exc.args
        TALLY["named_errors"] += 1
        return
    TALLY["completed"] += 1
    check_tables(results, expected_requests(config))
    folder = tmp_path_factory.mktemp("saved")
    fmt = data.draw(st.sampled_from(("csv", "parquet")))
    loaded = Results.load(results.save(folder, fmt))
    for name in ("requests", "steps"):
        assert getattr(loaded, name).equals(getattr(results, name)), name
        assert dict(getattr(loaded, name).dtypes) == dict(getattr(results, name).dtypes), name
    assert [None if t is None else list(t) for t in loaded.token_times] == \
           [None if t is None else list(t) for t in results.token_times]
