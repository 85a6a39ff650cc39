"""benchmarks/published_check.py: its CSV of published vLLM figures is well formed, and rows map to
configs and workloads servesim accepts (nothing is simulated here)."""
import pytest

from sim.api.cost_setup import build_cost_model
from tests.benchmark_loader import load_benchmark

check = load_benchmark("published_check")
ROWS = check.read_rows()


def test_every_row_has_a_source_and_a_positive_value():
    assert len(ROWS) >= 4
    assert len({r["source_url"] for r in ROWS}) >= 2
    for r in ROWS:
        assert r["source_url"].startswith("https://"), r
        assert r["value"] > 0 and r["tp"] >= 1 and r["num_prompts"] >= 1, r
        assert r["metric"] in check.SUMMARY_KEY, r["metric"]
        check.load(r)  # a known load form


@pytest.mark.parametrize("index", [0, 4, 12])  # latency batch, offline ShareGPT at TP 4, concurrency
def test_rows_map_to_valid_configs(index):
    row = ROWS[index]
    config = check.config_for(row)
    assert config.deployment.tensor_parallel_size == row["tp"]
    assert config.seed == 0
    build_cost_model(config.deployment, config.engine)


def test_sharegpt_requests_hold_the_published_means():
    requests = check.sharegpt_requests(200)
    assert len(requests) == 200 and all(r.arrival_time_s == 0.0 for r in requests)
    prompt = sum(len(r.prompt_token_ids) for r in requests) / 200
    output = sum(r.sampling_params.max_tokens for r in requests) / 200
    assert prompt == pytest.approx(check.SHAREGPT_MEAN_TOKENS[0], rel=0.02)
    assert output == pytest.approx(check.SHAREGPT_MEAN_TOKENS[1], rel=0.02)
    again = check.sharegpt_requests(200)
    assert [len(r.prompt_token_ids) for r in again] == [len(r.prompt_token_ids) for r in requests]


def test_concurrency_rows_cap_their_requests():
    row = next(r for r in ROWS if check.load(r)[0] == "concurrency")
    workload = check.workload_for(row, max_prompts=50)
    assert workload.num_users == check.load(row)[1]
    assert workload.num_requests == max(50, workload.num_users)
