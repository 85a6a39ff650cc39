"""Bad input through the Python API is a ConfigError naming the field and the value, before the run:
request specs, spec lists, token texts, result folders (each once a raw exception, a hang or wrong
numbers; found by fuzzing the API)."""
from __future__ import annotations

import numpy as np
import pytest

from kernels_cost_model.errors import ConfigError
from sim import SimulationConfig, simulate
from sim.api.results import Results
from sim.core.sampling_params import SamplingParams
from sim.core.speculative import SpeculativeConfig
from workloads.spec import RequestSpec

PROMPT = np.arange(20, dtype=np.int32) + 10
CONFIG = SimulationConfig(engine={"max_model_len": 256, "num_gpu_blocks": 64}, deployment={"cost_model": "linear"})


@pytest.mark.parametrize("fields, named", [
    ({"arrival_time_s": 1e15}, "request.arrival_time_s=1000000000000000.0: must be a finite number in [0, 1e+10]"),
    ({"abort_time_s": 2e10}, "request.abort_time_s=20000000000.0: must be a finite number"),
    ({"sampling_params": None}, "request.sampling_params=None: must be a SamplingParams"),
    ({"output_token_ids": 5}, "request.output_token_ids=5: must be a sequence of token ids"),
    ({"request_id": ""}, "request_id='': must be a non-empty string"),
    ({"request_id": ("a", 1)}, "request_id=('a', 1): must be a non-empty string"),
    ({"tenant": None}, "request.tenant=None: must be a string"),
    ({"session_id": 3}, "request.session_id=3: must be a string or None"),
    ({"return_hidden_states": "yes"}, "request.return_hidden_states='yes': must be true or false"),
])
def test_a_bad_request_spec_is_named(fields, named):
    with pytest.raises(ConfigError) as err:
        RequestSpec(**{"arrival_time_s": 0.0, "prompt_token_ids": PROMPT, "output_len": 5, **fields})
    assert str(err.value).startswith(named)


def test_sampling_params_may_be_given_as_a_dict():
    spec = RequestSpec(0.0, PROMPT, output_len=5, sampling_params={"max_tokens": 3, "ignore_eos": True})
    assert spec.sampling_params == SamplingParams(max_tokens=3, ignore_eos=True)


@pytest.mark.parametrize("specs, named", [
    ([RequestSpec(1.0, PROMPT, output_len=5, request_id="a"), RequestSpec(0.1, PROMPT, output_len=5, request_id="b")],
     "workload[1].arrival_time_s=0.1: arrivals must be sorted"),
    ([RequestSpec(0.0, PROMPT, output_len=5, request_id="req-1"), RequestSpec(0.1, PROMPT, output_len=7)],
     "workload[1].request_id=None: would be 'req-1', the id workload[0] gives"),
])
def test_a_bad_spec_list_is_named_before_the_run(specs, named):
    with pytest.raises(ConfigError) as err:
        simulate(CONFIG, workload=specs)
    assert str(err.value).startswith(named)


def test_unsorted_arrivals_read_as_the_run_goes_are_a_config_error():
    specs = iter([RequestSpec(1.0, PROMPT, output_len=5, request_id="a"),
                  RequestSpec(0.1, PROMPT, output_len=5, request_id="b")])
    with pytest.raises(ConfigError, match="b.arrival_time_s=0.1: arrivals must be sorted"):
        simulate(CONFIG, workload=specs)


@pytest.mark.parametrize("token_text, named", [
    (5, "token_text=5: must be a dict"), ("abc", "token_text='abc': must be a dict"),
    ({97: 5}, "token_text[97]=5: must be a str"),
])
def test_a_bad_token_text_is_named_before_the_run(token_text, named):
    specs = [RequestSpec(0.0, PROMPT, output_token_ids=(97, 98, 99), sampling_params=SamplingParams(stop=("x",)))]
    with pytest.raises(ConfigError) as err:
        simulate(CONFIG, workload=specs, token_text=token_text)
    assert str(err.value).startswith(named)


def test_a_token_text_callable_that_returns_no_str_is_named():
    specs = [RequestSpec(0.0, PROMPT, output_token_ids=(97, 98, 99), sampling_params=SamplingParams(stop=("x",)))]
    with pytest.raises(ConfigError, match=r"token_text\(97\)=None: must return a str"):
        simulate(CONFIG, workload=specs, token_text=lambda token: None)


@pytest.mark.parametrize("rates", [0.5, False, 2**63, [True, 0.5], []])
def test_acceptance_rates_must_be_a_list_of_probabilities(rates):
    with pytest.raises(ConfigError, match="speculative_config.acceptance_rates"):
        SpeculativeConfig(method="eagle", num_speculative_tokens=2, acceptance_rates=rates)


@pytest.mark.parametrize("fields, named", [({"tree_sibling_decay": True}, "speculative_config.tree_sibling_decay"),
                                           ({"model": 5}, "speculative_config.model=5")])
def test_a_bool_or_a_number_is_no_speculative_setting_of_another_type(fields, named):
    with pytest.raises(ConfigError, match=named):
        SpeculativeConfig(method="eagle", num_speculative_tokens=2, **fields)


def test_a_result_folder_must_be_a_path():
    results = simulate(CONFIG, workload=[RequestSpec(0.0, PROMPT, output_len=3)])
    for call in (lambda: results.save(None), lambda: Results.load(None)):
        with pytest.raises(ConfigError, match="directory=None: must be a folder's path"):
            call()


@pytest.mark.parametrize("replica, named", [({"gpu": "h999"}, "deployment.gpu='h999': unknown GPU"),
                                            ({"model": "nope"}, "deployment.model='nope': unknown model")])
def test_an_unknown_gpu_or_model_of_a_replica_is_named(replica, named):
    """Sizing the replica's cache read the batch defaults an unknown GPU leaves unset first, and named
    deployment.max_num_batched_tokens=None."""
    from sim.planning.cluster import simulate_cluster
    with pytest.raises(ConfigError) as err:
        simulate_cluster(SimulationConfig(workload={"num_requests": 5}), [replica])
    assert str(err.value).startswith(named)
