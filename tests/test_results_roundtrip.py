"""Results.save then Results.load gives the same run back, column types included, in CSV and Parquet."""
from __future__ import annotations

import pytest

from sim import SamplingParams, SimulationConfig, simulate
from sim.api.results import Results, parquet_available
from workloads.spec import RequestSpec

FORMATS = ["csv"] + (["parquet"] if parquet_available() else [])


@pytest.fixture(scope="module")
def mixed_results():
    """A run whose stop_reason mixes a stop string, a stop token id and None, with a rejected request,
    sessions and tenants set on some rows only."""
    specs = [
        RequestSpec(0.0, [1, 2, 3], output_token_ids=(65, 66, 67, 68),
                    sampling_params=SamplingParams(max_tokens=10, stop=["C"]), session_id="s1", tenant="t"),
        RequestSpec(0.1, [1, 2, 3], output_token_ids=(65, 7, 67), sampling_params=SamplingParams(max_tokens=10,
                                                                                            stop_token_ids=[7])),
        RequestSpec(0.2, [1, 2, 3], output_len=3, sampling_params=SamplingParams(max_tokens=10)),
        RequestSpec(0.3, [5] * 700, output_len=3),  # longer than max_model_len: rejected
        RequestSpec(0.4, [1, 2], output_token_ids=(300, 9000), sampling_params=SamplingParams(max_tokens=2)),
    ]
    config = SimulationConfig().replace(engine={"num_gpu_blocks": 64, "max_model_len": 512},
                                        deployment={"cost_model": "linear"})
    with pytest.warns(UserWarning, match="rejected"):
        return simulate(config, workload=specs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_is_identical(mixed_results, tmp_path, fmt):
    assert list(mixed_results.requests["stop_reason"]) == ["C", 7, None, None, None]
    loaded = Results.load(mixed_results.save(tmp_path, fmt))
    for name in ("requests", "steps"):
        before, after = getattr(mixed_results, name), getattr(loaded, name)
        assert dict(after.dtypes) == dict(before.dtypes), name
        assert after.equals(before), name
    assert [type(v) for v in loaded.requests["stop_reason"]] == [str, int, type(None), type(None), type(None)]
    assert loaded.tokens().equals(mixed_results.tokens())
    assert loaded.token_times == mixed_results.token_times
    assert loaded.meta == mixed_results.meta
    assert loaded.summary.keys() == mixed_results.summary.keys()
    for key, value in mixed_results.summary.items():
        assert loaded.summary[key] == value or (value != value and loaded.summary[key] != loaded.summary[key]), key


def test_a_run_without_token_times_or_steps_round_trips(tmp_path):
    config = SimulationConfig().replace(engine={"num_gpu_blocks": 64, "max_model_len": 64, "record_token_times": False},
                                        deployment={"cost_model": "linear"})
    with pytest.warns(UserWarning, match="rejected"):
        results = simulate(config, workload=[RequestSpec(0.0, [1] * 100, output_len=2)])
    assert len(results.steps) == 0 and results.token_times == [None]
    for fmt in FORMATS:
        loaded = Results.load(results.save(tmp_path / fmt, fmt))
        assert dict(loaded.steps.dtypes) == dict(results.steps.dtypes) and loaded.steps.equals(results.steps)
        assert loaded.token_times == [None] and loaded.requests.equals(results.requests)


@pytest.mark.parametrize("fmt", FORMATS)
def test_stop_token_ids_alone_stay_ints(tmp_path, fmt):
    """Token ids and None alone (no stop string) are still an object column of ints: pandas would infer
    float64 (7.0, NaN), and a disaggregated run's join refused a stop string into such a column."""
    specs = [RequestSpec(0.0, [1, 2, 3], output_token_ids=(65, 7, 67),
                         sampling_params=SamplingParams(max_tokens=10, stop_token_ids=[7])),
             RequestSpec(0.1, [1, 2, 3], output_len=3, sampling_params=SamplingParams(max_tokens=10))]
    config = SimulationConfig().replace(engine={"num_gpu_blocks": 64, "max_model_len": 512},
                                        deployment={"cost_model": "linear"})
    results = simulate(config, workload=specs)
    assert results.requests["stop_reason"].dtype == object
    assert [type(v) for v in results.requests["stop_reason"]] == [int, type(None)]
    loaded = Results.load(results.save(tmp_path, fmt))
    assert [type(v) for v in loaded.requests["stop_reason"]] == [int, type(None)]
