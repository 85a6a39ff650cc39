"""Stop strings found in the front end, as vLLM V1 does (issue 20, difference 6).

vLLM's detokenizer runs in the API server: it tells the client of a stop string at once and sends the
engine core an abort, which lands while the next step runs. Meanwhile the request is scheduled again
(once, twice under async scheduling) and keeps its KV. The client sees the same thing either way.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.errors import ConfigError
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.sampling_params import SamplingParams
from sim.engine.simulation import run_engine
from tests.engine_harness import EOS, engine_configs
from workloads.spec import RequestSpec

TOKEN_TEXT = {EOS: "", **{t: "abcdefghij"[t - 3] for t in range(3, 13)}}
COST = LinearCostModel(fixed_s=1.0, per_new_token_s=0.0, per_context_token_s=0.0, per_sampled_s=0.0)


def _run(specs, config, mode):
    config = dataclasses.replace(config, stop_string_detection=mode)
    return run_engine(specs, config, COST, token_text=TOKEN_TEXT)


def _one(stop=("cd",), stream=(3, 4, 5, 6, 7, 8, 9, 10)):
    return [RequestSpec(0.0, np.arange(8, dtype=np.int32) + 500, output_token_ids=stream, request_id="r0",
                        sampling_params=SamplingParams(max_tokens=20, stop=stop))]


@pytest.mark.parametrize("async_", [False, True])
def test_the_engine_runs_a_stopped_request_one_more_step(async_):
    """'abcd...': 'cd' completes on the 4th output token. The front end's abort lands during the next
    step, so the request is scheduled once more than the engine would (under async scheduling that is
    two steps after the stop, the first already planned) and holds its KV meanwhile."""
    config = EngineConfig(block_size=4, num_gpu_blocks=32, max_model_len=64, eos_token_id=EOS,
                          async_scheduling=async_, check_invariants=True)
    engine_run, front = _run(_one(), config, "engine"), _run(_one(), config, "frontend")
    for rec in (engine_run.requests, front.requests):
        assert (rec.finish_reason[0], rec.stop_reason[0], rec.num_output_tokens[0]) == ("stop", "cd", 4)
    assert len(front.steps) == len(engine_run.steps) + 1
    assert front.requests.finish_time[0] == engine_run.requests.finish_time[0]  # the client's view
    def held(run):  # steps at whose end the request still holds KV
        return sum(1 for n in run.steps.kv_blocks_used if n > 0)
    assert held(front) == held(engine_run) + 1 and front.steps.kv_blocks_used[-1] == 0


def test_token_stops_are_not_delayed():
    """EOS and stop token ids are found in the engine core either way: nothing changes."""
    specs = [RequestSpec(0.0, np.arange(8, dtype=np.int32) + 500, output_token_ids=(3, 4, EOS, 5),
                         request_id="r0", sampling_params=SamplingParams(max_tokens=20, stop=("zz",)))]
    config = EngineConfig(block_size=4, num_gpu_blocks=32, max_model_len=64, eos_token_id=EOS)
    a, b = _run(specs, config, "engine"), _run(specs, config, "frontend")
    assert len(a.steps) == len(b.steps) and b.requests.finish_reason[0] == "stop"


def test_held_kv_delays_a_waiting_request():
    """With one seat, the next request waits for the abort, not for the client's stop."""
    specs = _one() + [RequestSpec(0.5, np.arange(8, dtype=np.int32) + 900, output_token_ids=(3, 3, 3),
                                  request_id="r1", sampling_params=SamplingParams(max_tokens=3))]
    config = EngineConfig(block_size=4, num_gpu_blocks=32, max_model_len=64, max_num_seqs=1,
                          eos_token_id=EOS, async_scheduling=False)
    a, b = _run(specs, config, "engine"), _run(specs, config, "frontend")
    assert b.requests.first_token_time[1] == a.requests.first_token_time[1] + 1.0


def test_defaults_and_errors():
    assert EngineConfig().stop_strings_in_frontend
    assert not EngineConfig(stop_profile="vllm-v0").stop_strings_in_frontend
    assert not EngineConfig(policy="orca").stop_strings_in_frontend
    assert not EngineConfig(stop_string_detection="engine").stop_strings_in_frontend
    with pytest.raises(ConfigError, match="stop_string_detection"):
        EngineConfig(stop_string_detection="detokenizer")


@st.composite
def workloads(draw):
    specs, t = [], 0.0
    for i in range(draw(st.integers(1, 6))):
        t += draw(st.sampled_from([0.0, 0.5, 2.0]))
        max_tokens = draw(st.integers(1, 25))
        params = SamplingParams(max_tokens=max_tokens, min_tokens=draw(st.integers(0, min(3, max_tokens))),
                                ignore_eos=draw(st.booleans()), stop_token_ids=draw(st.sampled_from([(), (7,)])),
                                stop=draw(st.sampled_from([(), ("cd",), ("e", "bc"), ("aa",)])),
                                include_stop_str_in_output=draw(st.booleans()))
        prompt = np.asarray(draw(st.lists(st.integers(3, 40), min_size=1, max_size=40)), dtype=np.int32)
        stream = tuple(draw(st.lists(st.integers(2, 12), min_size=1, max_size=30)))
        specs.append(RequestSpec(t, prompt, output_token_ids=stream, sampling_params=params,
                                 request_id=f"r{i}", priority=draw(st.integers(0, 2))))
    return specs


@given(workloads(), engine_configs(max_model_len=64), st.booleans())
def test_client_sees_the_same_outputs_either_way(specs, config, async_):
    """Outputs, finish and stop reasons are the same; every request finishes and frees its KV (run_engine
    checks both); the front end never takes fewer steps."""
    config = dataclasses.replace(config, async_scheduling=async_)
    a, b = _run(specs, config, "engine"), _run(specs, config, "frontend")
    ra, rb = a.requests, b.requests
    for i in range(len(ra)):
        assert (ra.finish_reason[i], ra.stop_reason[i], ra.num_output_tokens[i]) == \
               (rb.finish_reason[i], rb.stop_reason[i], rb.num_output_tokens[i])
    if not any(s.sampling_params.stop for s in specs):
        assert len(a.steps) == len(b.steps)


def test_cli_flag():
    from tests.test_cli_vllm_names import config_of
    assert config_of("--stop-string-detection", "engine").engine.stop_string_detection == "engine"
    assert config_of().engine.stop_string_detection is None


def test_cli_warns_when_the_flag_cannot_matter(capsys):
    from sim.cli.main import main
    argv = ["run", "--num-prompts", "5", "--cost-model", "linear", "--num-gpu-blocks-override", "4000",
            "--max-model-len", "8192"]
    assert main([*argv, "--stop-string-detection", "engine"]) == 0
    assert "--stop-string-detection=engine changed nothing" in capsys.readouterr().err
    assert main(argv) == 0
    assert "changed nothing" not in capsys.readouterr().err
