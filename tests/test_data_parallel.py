"""DP + EP runs (vLLM's --data-parallel-size with --enable-expert-parallel) through simulate() and the CLI."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kernels_cost_model.errors import ConfigError
from sim import SimulationConfig, simulate
from sim.cli.main import main

MOE = {"model": "qwen3-30b-a3b", "enable_expert_parallel": True}


def config(dp: int, rate: float = 50.0, n: int = 120, **deployment) -> SimulationConfig:
    return SimulationConfig().replace(deployment={**MOE, "data_parallel_size": dp, **deployment},
                                      workload={"num_requests": n, "rate": rate})


def test_dp_run_is_deterministic_and_finishes_every_request_once():
    a, b = simulate(config(4, rate=40.0)), simulate(config(4, rate=40.0))
    assert a.summary == b.summary
    assert a.requests.equals(b.requests)
    ids = a.requests["request_id"]
    assert len(ids) == 120 and ids.is_unique
    assert set(a.requests["replica"]) == {0, 1, 2, 3}  # the load balancer used every rank


@settings(max_examples=6, deadline=None)
@given(st.integers(2, 5), st.sampled_from([5.0, 40.0, 400.0]), st.integers(0, 3))
def test_every_request_finishes_once_on_one_rank(dp, rate, seed):
    results = simulate(config(dp, rate=rate, n=30).replace(seed=seed))
    requests = results.requests
    assert len(requests) == 30 and requests["request_id"].is_unique
    assert requests["replica"].between(0, dp - 1).all()
    assert (requests["finish_reason"] == "length").all()


def test_dp_throughput_exceeds_one_rank_at_high_load():
    one, four = simulate(config(1, rate=200.0)), simulate(config(4, rate=200.0))
    assert four.summary["output_throughput"] > 1.5 * one.summary["output_throughput"]


def test_dp_counts_every_gpu():
    results = simulate(config(2, n=20))
    assert results.summary["num_gpus"] == 2 and results.meta["num_gpus"] == 2
    assert results.summary["data_parallel_size"] == 2
    assert results.meta["num_gpu_blocks"] == 2 * results.meta["kv_cache_tokens"] // results.meta["block_size"]


def test_dp_one_equals_the_plain_run():
    plain = SimulationConfig().replace(deployment=MOE, workload={"num_requests": 30, "rate": 20.0})
    one = config(1, rate=20.0, n=30)
    assert simulate(one).summary == simulate(plain).summary


@pytest.mark.parametrize("deployment, reason", [
    ({"data_parallel_size": 0}, ">= 1"),
    ({"data_parallel_size": 2, "enable_expert_parallel": False}, "enable_expert_parallel"),
    ({"data_parallel_size": 2, "tensor_parallel_size": 2}, "TP 1"),
    ({"data_parallel_size": 2, "model": "llama-3.1-8b"}, "mixture-of-experts"),
    ({"data_parallel_size": 2, "cost_model": "linear"}, "roofline"),
])
def test_bad_data_parallel_values_name_the_field(deployment, reason):
    with pytest.raises(ConfigError) as err:
        SimulationConfig().replace(deployment={**MOE, **deployment})
    assert err.value.field == "deployment.data_parallel_size"
    assert reason in str(err.value)


def test_cli_dp_flag_runs_and_bad_value_exits_2(tmp_path, capsys):
    args = ["run", "--model", "qwen3-30b-a3b", "--enable-expert-parallel", "--num-prompts", "20",
            "--request-rate", "20"]
    assert main(args + ["-dp", "2", "--out", str(tmp_path / "run")]) == 0
    assert "(TP 1 x DP 2)" in (tmp_path / "run" / "summary.txt").read_text()
    assert main(args + ["--data-parallel-size", "0", "--out", str(tmp_path / "bad")]) == 2
    assert "deployment.data_parallel_size" in capsys.readouterr().err


def test_deepseek_v3_runs_as_dp8_ep8_on_h200():
    """671B of FP8 weights do not fit one GPU; with 1/8 of the experts per rank they do."""
    results = simulate(SimulationConfig().replace(
        deployment={"model": "deepseek-v3", "gpu": "h200", "enable_expert_parallel": True, "data_parallel_size": 8},
        workload={"num_requests": 40, "rate": 20.0}))
    assert len(results.requests) == 40 and results.summary["num_gpus"] == 8


def test_fp8_kv_cache_doubles_the_rank_kv_blocks():
    from kernels_cost_model.expert_parallel import ep_kv_cache_blocks
    auto = ep_kv_cache_blocks("qwen3-30b-a3b", "h100", 4)
    assert ep_kv_cache_blocks("qwen3-30b-a3b", "h100", 4, kv_cache_dtype="fp8") == pytest.approx(2 * auto, rel=1e-3)


def test_dp_with_pipeline_stages_or_kv_offloading_names_the_field(tmp_path, capsys):
    args = ["run", "--model", "qwen3-30b-a3b", "--enable-expert-parallel", "-dp", "2", "--num-prompts", "5"]
    for extra in (["-pp", "2"], ["--kv-offloading-size", "10"]):
        assert main(args + extra + ["--out", str(tmp_path / extra[0].strip("-"))]) == 2
        assert "deployment.data_parallel_size" in capsys.readouterr().err


def test_client_aborts_reach_the_rank_that_holds_the_request():
    import dataclasses
    from workloads import poisson_workload
    from workloads.rng import make_rng
    specs = list(poisson_workload(40.0, 40, "sharegpt").iter_requests(make_rng(0, "workload")))
    specs = [dataclasses.replace(s, abort_time_s=s.arrival_time_s + 0.5) if i % 2 else s
             for i, s in enumerate(specs)]
    results = simulate(config(2), workload=specs)
    reasons = results.requests["finish_reason"]
    assert len(results.requests) == 40 and (reasons == "abort").sum() > 0
    assert reasons.isin(["abort", "length"]).all()
