"""Results: save/load round trips (parquet and csv) and determinism of whole runs."""
import json

import pandas as pd
import pytest

from sim import __version__

from sim import Results, SimulationConfig, simulate

SMALL = SimulationConfig().replace(workload={"num_requests": 60, "rate": 20.0}, slo={"ttft_s": 0.2})


@pytest.fixture(scope="module")
def results():
    return simulate(SMALL)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_save_load_round_trip(results, tmp_path, fmt):
    results.save(tmp_path, fmt=fmt)
    assert {p.name for p in tmp_path.iterdir()} >= {f"requests.{fmt}", f"steps.{fmt}", f"tokens.{fmt}",
                                                     "summary.json"}
    back = Results.load(tmp_path)
    assert back.summary == pytest.approx(results.summary, nan_ok=True)
    assert back.meta["config"] == json.loads(json.dumps(results.meta["config"]))
    pd.testing.assert_frame_equal(back.steps, results.steps, check_dtype=False)
    numeric = results.requests.select_dtypes("number").columns
    pd.testing.assert_frame_equal(back.requests[numeric], results.requests[numeric], check_dtype=False)
    assert back.requests["finish_reason"].tolist() == results.requests["finish_reason"].tolist()
    assert [list(t) for t in back.token_times] == [list(t) for t in results.token_times]


def test_loaded_results_resummarise_identically(results, tmp_path):
    results.save(tmp_path, fmt="csv")
    again = Results.load(tmp_path).with_slo(ttft_s=0.2)
    assert again.summary == pytest.approx(results.summary, nan_ok=True)


def test_summary_json_is_plain_json(results, tmp_path):
    results.save(tmp_path)
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert set(doc) == {"servesim_version", "summary", "meta", "format", "nonfinite", "token_times_recorded",
                        "columns"}
    assert doc["meta"]["config"]["deployment"]["model"] == "llama-3.1-8b"
    assert doc["servesim_version"] == doc["meta"]["servesim_version"] == __version__


def test_load_names_a_folder_without_summary(tmp_path):
    with pytest.raises(FileNotFoundError, match="summary.json"):
        Results.load(tmp_path)


def test_tokens_of_requests_the_table_lacks_are_named(results, tmp_path):
    """A folder whose requests table lost its rows while its tokens kept theirs (report and plot once
    crashed on it with an IndexError)."""
    results.save(tmp_path, fmt="csv")
    requests = pd.read_csv(tmp_path / "requests.csv")
    requests.iloc[0:0].to_csv(tmp_path / "requests.csv", index=False)
    with pytest.raises(ValueError, match="has times of request_index 0, but the requests table has 0 rows"):
        Results.load(tmp_path)


def test_bad_format_is_named(results, tmp_path):
    with pytest.raises(ValueError, match="fmt='xlsx'"):
        results.save(tmp_path, fmt="xlsx")


def test_same_config_and_seed_give_identical_results(results):
    again = simulate(SMALL)
    assert again.summary == results.summary or again.summary == pytest.approx(results.summary, nan_ok=True)
    pd.testing.assert_frame_equal(again.requests, results.requests)
    pd.testing.assert_frame_equal(again.steps, results.steps)
    assert [list(t) for t in again.token_times] == [list(t) for t in results.token_times]


def test_another_seed_gives_other_traffic(results):
    other = simulate(SMALL.replace(seed=1))
    assert not other.requests["arrival_time"].equals(results.requests["arrival_time"])


def test_summary_has_the_documented_keys(results):
    s = results.summary
    for metric in ("ttft", "tpot", "itl", "e2el", "queueing"):
        for stat in ("mean", "median", "std", "p90", "p99"):
            assert f"{stat}_{metric}_ms" in s
    for key in ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
                "max_output_tokens_per_s", "max_concurrent_requests", "request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
                "slo_attainment", "num_preemptions", "prefix_cache_hit_rate", "kv_occupancy_mean",
                "kv_occupancy_peak", "kv_time_above_90pct"):
        assert key in s


def test_empty_statistics_are_null_in_json_and_nan_after_load(tmp_path):
    import math

    import numpy as np

    from sim import SamplingParams
    from workloads import RequestSpec
    config = SimulationConfig().replace(deployment={"cost_model": "linear"}, engine={"num_gpu_blocks": 600})
    spec = RequestSpec(0.0, np.arange(10), sampling_params=SamplingParams(max_tokens=1, ignore_eos=True))
    simulate(config, workload=[spec]).save(tmp_path)
    text = (tmp_path / "summary.json").read_text()
    assert "NaN" not in text and json.loads(text)["summary"]["mean_tpot_ms"] is None
    assert math.isnan(Results.load(tmp_path).summary["mean_tpot_ms"])


def test_cli_json_is_strict(capsys):
    from sim.cli.main import main
    assert main(["run", "--num-requests", "1", "--max-tokens", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out, parse_constant=lambda c: 1 / 0)["mean_tpot_ms"] is None


def test_config_errors_name_the_toml_path():
    from sim import ConfigError
    with pytest.raises(ConfigError, match=r"^engine\.max_num_seqs=0: ") as info:
        SimulationConfig().replace(engine={"max_num_seqs": 0})
    assert info.value.field == "engine.max_num_seqs"
    with pytest.raises(ConfigError, match=r"^engine\.speed=3: unknown setting"):
        SimulationConfig().replace(engine={"speed": 3})
    with pytest.raises(ConfigError, match=r"^engine\.policy='fifo'"):
        simulate(SimulationConfig().replace(engine={"policy": "fifo"}))
