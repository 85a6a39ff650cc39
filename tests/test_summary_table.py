"""The printed summary: columns sized to their content, long latencies in seconds, the header names the
cost model actually used."""
import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim import SimulationConfig, simulate
from sim.api.metrics import LATENCY_METRICS
from sim.api.report import format_summary, latency_table
from sim.cli.main import main

STATS = ("mean", "median", "p90", "p99")


def summary_with(latencies: dict[str, list[float]]) -> dict:
    out = {}
    for metric, values in latencies.items():
        for stat, value in zip(STATS, values):
            out[f"{stat}_{metric}_ms"] = value
    return out


def parse_row(line: str) -> tuple[str, list[float]]:
    label, cells = re.fullmatch(r"(.+?\((?:ms|s)\))\s+(.*)", line).groups()
    return label, [float(c.replace(",", "")) for c in cells.split()]


latency = st.floats(min_value=0, max_value=1e9, allow_nan=False)


@given(st.lists(st.lists(latency, min_size=4, max_size=4), min_size=5, max_size=5))
def test_every_cell_stays_a_separate_number_and_reads_back(values):
    summary = summary_with(dict(zip(LATENCY_METRICS, values)))
    header, *rows = latency_table(summary)
    assert header.split() == ["Latency", *STATS]
    for row, expected in zip(rows, values):
        label, cells = parse_row(row)
        seconds = label.endswith("(s)")
        assert seconds == (max(expected) >= 10_000)
        assert cells == pytest.approx([v / 1e3 if seconds else v for v in expected], abs=0.006)
    assert len({len(line) for line in [header, *rows]}) == 1  # one column grid


def test_the_readme_70b_numbers_no_longer_merge():
    summary = summary_with({"ttft": [58_638.55, 58_721.45, 115_617.29, 128_139.55]})
    (row,) = latency_table(summary, metrics=["ttft"])[1:]
    assert row.split() == ["TTFT", "(s)", "58.64", "58.72", "115.62", "128.14"]


def test_an_overloaded_run_prints_seconds_through_the_cli(capsys):
    code = main(["run", "--num-prompts", "150", "--request-rate", "200", "--num-gpu-blocks-override", "2000",
                 "--max-model-len", "8192"])
    out = capsys.readouterr().out
    assert code == 0 and "TTFT (s)" in out and "E2E latency (s)" in out


@pytest.mark.parametrize("deployment, words", [
    ({}, "roofline cost model calibrated on h100-sxm kernels"),
    ({"gpu": "l4"}, "uncalibrated roofline cost model"),
    ({"cost_model": "linear"}, "linear cost model"),
    ({"tensor_parallel_size": 2, "interconnect": "pcie"}, "llama-3.1-8b on 2x h100 over pcie (roofline"),
    ({"gpu": "rtx-pro-6000", "calibration": "rtx-pro-6000@vllm-0.19"},
     "calibrated on rtx-pro-6000 kernels, calibration rtx-pro-6000@vllm-0.19"),
])
def test_header_names_the_cost_model_in_use(deployment, words):
    model = {"model": "qwen2.5-0.5b"} if deployment.get("gpu") == "l4" else {}
    config = SimulationConfig().replace(deployment={**deployment, **model}, workload={"num_requests": 5})
    with pytest.warns(UserWarning) if deployment.get("gpu") == "l4" else contextlib.nullcontext():
        results = simulate(config)
    first = format_summary(results.summary, results.meta).splitlines()[0]
    assert words in first and "(roofline cost model)" not in first



@pytest.mark.parametrize("workload, shown", [
    ({"kind": "trace", "path": "t.csv", "target_rate": 10.0}, "; trace t.csv rescaled to 10 req/s; seed 0"),
    ({"kind": "trace", "path": "t.csv"}, "; trace t.csv; seed 0"),
    ({"kind": "gamma", "rate": 5.0, "cv": 2.0, "lengths": "sharegpt"},
     "; gamma 5.0 req/s (cv 2), sharegpt lengths; seed 0"),
])
def test_the_header_names_a_traces_rescaled_rate_and_gamma_arrivals_cv(workload, shown):
    """`servesim run --trace X --target-rate 10` (or --burstiness) ran at a rate the header did not show."""
    from sim.api.report import describe_setup
    config = {"deployment": {"model": "llama-3.1-8b", "gpu": "h100"}, "engine": {"policy": "vllm"},
              "workload": workload, "seed": 0}
    assert describe_setup({"config": config, "num_gpu_blocks": 10, "block_size": 16}).endswith(shown)
