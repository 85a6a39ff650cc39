"""Client-side latency ([client], sim/api/client.py): results only, the engine unchanged."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernels_cost_model.errors import ConfigError
from sim.api.client import ClientConfig, shift_token_times
from sim.api.simulator import SimulationConfig, simulate

BASE = {"deployment": {"cost_model": "linear"}, "engine": {"num_gpu_blocks": 2000, "max_model_len": 16384,
                                                           "record_token_times": True},
        "workload": {"rate": 20.0, "num_requests": 40}, "seed": 3}


def _run(**client):
    return simulate(SimulationConfig.from_dict(dict(BASE, client=client)))


def test_off_by_default_and_engine_unchanged():
    plain, shifted = _run(), _run(ttft_s=0.005, per_token_s=0.0002)
    assert SimulationConfig().client.is_off
    assert "client" not in plain.meta
    assert shifted.steps.equals(plain.steps)
    assert shifted.meta["client"] == {"ttft_s": 0.005, "per_token_s": 0.0002}


def test_ttft_tpot_and_e2e_move_by_the_stated_amounts():
    plain, shifted = _run(), _run(ttft_s=0.005, per_token_s=0.0002)
    done = plain.requests["completed"]
    assert done.sum() > 30
    p, s = plain.requests[done], shifted.requests[done]
    assert np.allclose(s["ttft_s"] - p["ttft_s"], 0.005)
    n = p["num_output_tokens"]
    assert np.allclose(s["e2e_s"] - p["e2e_s"], 0.005 + 0.0002 * (n - 1))
    multi = n > 1
    assert np.allclose((s["tpot_s"] - p["tpot_s"])[multi], 0.0002)
    assert np.allclose(s["arrival_time"], p["arrival_time"])
    assert shifted.summary["mean_ttft_ms"] == pytest.approx(plain.summary["mean_ttft_ms"] + 5.0)


def test_token_times_follow_the_requests():
    shifted = _run(ttft_s=0.01, per_token_s=0.001)
    req = shifted.requests
    for i, times in enumerate(shifted.token_times[:10]):
        t = np.frombuffer(times, dtype=float)
        assert t[0] == pytest.approx(req["first_token_time"][i])
        assert t[-1] == pytest.approx(req["finish_time"][i])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 100, allow_nan=False), max_size=20), st.floats(0, 1), st.floats(0, 0.1))
def test_shift_keeps_order_and_adds_at_least_ttft(times, ttft, per_token):
    from array import array
    times = sorted(times)
    out = np.frombuffer(shift_token_times([array("d", times)], ClientConfig(ttft, per_token))[0], dtype=float)
    assert len(out) == len(times)
    assert np.all(np.diff(out) >= np.diff(times) - 1e-9)
    assert np.all(out - np.array(times) >= ttft - 1e-9)


@pytest.mark.parametrize("field,value", [("ttft_s", -0.001), ("per_token_s", 61.0), ("ttft_s", "5ms")])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ConfigError) as err:
        SimulationConfig.from_dict({"client": {field: value}})
    assert err.value.field == f"client.{field}"


def test_unknown_client_key_is_named():
    with pytest.raises(ConfigError) as err:
        SimulationConfig.from_dict({"client": {"latency": 1}})
    assert err.value.field == "client.latency"


def test_cli_flags_reach_the_config():
    from sim.cli.main import build_parser
    from sim.cli.run import config_from_args
    args = build_parser().parse_args(["run", "--client-ttft", "5ms", "--client-per-token", "0.1ms"])
    config = config_from_args(args)
    assert config.client.ttft_s == pytest.approx(0.005)
    assert config.client.per_token_s == pytest.approx(1e-4)
