"""Sweeps: grid validation, determinism across executors, result reuse from the output folder."""
import importlib.util

import pandas as pd
import pytest

from sim import SimulationConfig
from kernels_cost_model.errors import ConfigError
from sim.planning import sweep as sweep_mod
from sim.planning.sweep import grid, points, run_sweep

HAS_RAY = importlib.util.find_spec("ray") is not None
TINY = {"deployment": {"cost_model": "linear"}, "engine": {"num_gpu_blocks": 1024, "max_model_len": 4096},
        "workload": {"num_requests": 10, "max_tokens": 16}}


@pytest.fixture(scope="module")
def base():
    return SimulationConfig.from_dict(TINY)


@pytest.fixture(scope="module")
def hundred_points(base):
    axes = {"rate": [2, 5, 10, 20, 40], "max_num_seqs": [4, 16, 64], "chunked_prefill": [True, False],
            "replicas": [1, 2], "router": ["round_robin", "least_kv"]}
    return grid(base, axes)


@pytest.fixture(scope="module")
def serial_table(hundred_points):
    return run_sweep(hundred_points, seeds=[0], executor="serial")


def test_grid_is_the_product_with_one_row_per_config_and_seed(base):
    pts = grid(base, {"rate": [1, 2], "engine.max_num_seqs": [8, 16, 32]})
    assert len(pts) == 6 and pts[-1].config.engine.max_num_seqs == 32 and pts[-1].config.workload.rate == 2
    df = run_sweep(pts[:2], seeds=[0, 1], executor="serial")
    assert list(df["seed"]) == [0, 1, 0, 1] and {"p99_ttft_ms", "request_goodput", "workload.rate"} <= set(df.columns)


@pytest.mark.parametrize("axes, field", [
    ({}, "sweep"), ({"rate": []}, "sweep.rate"), ({"engine.nope": [1]}, "sweep.engine.nope"),
    ({"bogus": [1]}, "sweep"), ({"rate": [0.0]}, "workload.rate"), ({"rate": [-1]}, "workload.rate"),
    ({"gpu": ["tpu-v9"]}, "deployment.gpu"), ({"replicas": [0]}, "replicas"), ({"router": ["random"]}, "router"),
    ({"speculative_config.nope": [1]}, "sweep.speculative_config.nope"), ({"seed.x": [1]}, "sweep"),
])
def test_bad_sweeps_name_field_and_value(base, axes, field):
    with pytest.raises(ConfigError) as err:
        grid(base, axes)
    assert err.value.field == field


def test_speculative_config_fields_are_axes(base):
    """An axis over speculative decoding (it once crashed: the section has no default to read fields
    from); the fields given merge with the base's config, if any."""
    pts = grid(base, {"speculative_config.method": ["ngram", "eagle3"], "speculative_config.num_speculative_tokens": [2]})
    assert [(p.config.speculative_config.method, p.config.speculative_config.num_speculative_tokens)
            for p in pts] == [("ngram", 2), ("eagle3", 2)]


def test_empty_list_and_empty_run_are_config_errors(base):
    with pytest.raises(ConfigError):
        points(base, [])
    with pytest.raises(ConfigError):
        run_sweep([], seeds=[0])
    with pytest.raises(ConfigError) as err:
        run_sweep(points(base, [{"rate": 1}]), seeds=[0], executor="dask")
    assert err.value.field == "executor"


def test_keys_are_stable_and_distinguish_seed_and_config(base):
    a, b = points(base, [{"rate": 3}, {"rate": 3}])
    c = points(base, [{"rate": 4}])[0]
    assert a.key(0) == b.key(0) != a.key(1) and a.key(0) != c.key(0)
    assert len(a.key(0)) == 24


def test_pool_matches_serial_bit_for_bit(hundred_points, serial_table):
    assert len(hundred_points) >= 100
    pool = run_sweep(hundred_points, seeds=[0], executor="pool", workers=2)
    pd.testing.assert_frame_equal(serial_table, pool)


@pytest.mark.skipif(not HAS_RAY, reason="ray not installed (pip install 'servesim[ray]')")
def test_local_ray_cluster_matches_serial_bit_for_bit(hundred_points, serial_table):
    ray_table = run_sweep(hundred_points, seeds=[0], executor="ray", workers=2)
    pd.testing.assert_frame_equal(serial_table, ray_table)


def test_rerun_reuses_finished_results(base, tmp_path, monkeypatch):
    pts = grid(base, {"rate": [2, 4, 8]})
    first = run_sweep(pts, seeds=[0, 1], executor="serial", out_dir=tmp_path)
    files = sorted((tmp_path / "results").glob("*.json"))
    assert len(files) == 6
    files[0].unlink()                                   # as if interrupted before the last run
    calls = []
    real = sweep_mod.run_task
    monkeypatch.setattr(sweep_mod, "run_task", lambda task: calls.append(task) or real(task))
    second = run_sweep(pts, seeds=[0, 1], executor="serial", out_dir=tmp_path)
    assert len(calls) == 1
    pd.testing.assert_frame_equal(first, second)
    # damaged results (truncated, another key, an empty summary) run again: they once crashed the
    # rerun or gave a row of empty metrics
    files[1].write_text(files[1].read_text()[:20])
    files[2].write_text('{"key": "x", "summary": {"completed": 1}}')
    files[3].write_text('{"summary": {}}')
    calls.clear()
    with pytest.warns(UserWarning, match="damaged stored result"):
        third = run_sweep(pts, seeds=[0, 1], executor="serial", out_dir=tmp_path)
    assert len(calls) == 3
    pd.testing.assert_frame_equal(first, third)


def test_a_sweep_folder_whose_results_cannot_be_kept_is_named(base, tmp_path):
    (tmp_path / "results").write_text("not a folder")
    with pytest.raises(ConfigError, match="holds a file named results"):
        run_sweep(grid(base, {"rate": [2]}), seeds=[0], executor="serial", out_dir=tmp_path)


@pytest.mark.parametrize("axes, named", [
    ({"rate": [5, 10, 5]}, "sweep.rate=[5, 10, 5]: gives 5 twice"),
    ({"rate": [5, 5.0]}, "sweep.rate=[5, 5.0]: gives 5.0 twice"),
    ({"engine.max_num_seqs": [64, 64]}, "sweep.engine.max_num_seqs=[64, 64]: gives 64 twice"),
])
def test_an_axis_that_repeats_a_value_is_named(base, axes, named):
    """`rate = [5, 5]` ran every config of rate 5 twice and put both in sweep.csv as separate points."""
    with pytest.raises(ConfigError) as err:
        grid(base, axes)
    assert str(err.value).startswith(named)
    assert len(grid(base, {"prefix_caching": [True, False]})) == 2   # (booleans are not repeats of 1 and 0)
