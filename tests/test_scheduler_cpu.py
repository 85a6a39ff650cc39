"""The engine's per-step CPU time: our measurement of vLLM's scheduler (kernels_cost_model/scheduler_cpu.py)."""
import json

import numpy as np
import pytest

from kernels_cost_model.errors import ConfigError
from kernels_cost_model.scheduler_cpu import DATA_DIR, DEFAULT_FILE, default_scheduler_cpu, read_scheduler_cpu

FILES = sorted(DATA_DIR.glob("vllm-*.json"))


def test_measurements_ship_for_both_vllm_releases():
    assert {p.name for p in FILES} >= {"vllm-0.19.1.json", "vllm-0.33.0.json"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_each_file_states_its_source_and_reproduces_its_fit_error(path):
    data = json.loads(path.read_text())
    for key in ("vllm_version", "cpu_model", "date", "method"):
        assert data[key]
    assert path.name == f"vllm-{data['vllm_version']}.json"
    fit, points = data["fit"], data["points"]
    pred = np.array([fit["base_us"] + fit["per_request_us"] * p["scheduled_requests"]
                     + fit["per_token_us"] * p["scheduled_tokens"] for p in points])
    y = np.array([p["median_us"] for p in points])
    assert np.median(np.abs(pred - y) / y) == pytest.approx(fit["median_abs_rel_error"], rel=1e-6)
    assert fit["median_abs_rel_error"] < 0.25
    decodes = sorted((p["running"], p["median_us"]) for p in points if p["prefill_tokens"] == 0)
    assert all(a[1] < b[1] for a, b in zip(decodes, decodes[1:])), "CPU time grows with the batch"


def test_cost_model_default_is_the_measurement():
    from kernels_cost_model.cost_model import CPU_BASE_S, CPU_PER_REQUEST_S, CPU_PER_TOKEN_S, CPU_SOURCE
    measured = read_scheduler_cpu(DATA_DIR / DEFAULT_FILE)
    assert (CPU_BASE_S, CPU_PER_REQUEST_S, CPU_PER_TOKEN_S) == (measured.base_s, measured.per_request_s,
                                                                measured.per_token_s)
    assert CPU_SOURCE == default_scheduler_cpu().source and "measured" in CPU_SOURCE
    assert 1e-6 < CPU_PER_REQUEST_S < 1e-4
    assert measured.step_s(128, 128) == pytest.approx(CPU_BASE_S + 128 * (CPU_PER_REQUEST_S + CPU_PER_TOKEN_S))


@pytest.mark.parametrize("text", ["not json", json.dumps({"fit": {}}),
                                  json.dumps({"vllm_version": "x", "cpu_model": "c", "date": "d",
                                              "fit": {"base_us": -1, "per_request_us": 1, "per_token_us": 0}})])
def test_malformed_file_is_a_named_error(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_scheduler_cpu(path)
    assert err.value.field == "scheduler_cpu"
