"""Whose first token the client sees under disaggregation: the decode instance's (vLLM's proxy, the
default) or the prefill instance's (DistServe's and Splitwise's TTFT)."""
from __future__ import annotations

import numpy as np
import pytest

from kernels_cost_model.errors import ConfigError
from sim.api.sections import DeploymentConfig
from sim.api.simulator import SimulationConfig
from sim.core.sampling_params import SamplingParams
from sim.planning.disagg import DisaggregatedCluster
from sim.planning.disagg_config import DisaggConfig, PoolConfig, load_disaggregated
from workloads.spec import RequestSpec

EOS = 2


def _config(max_model_len=4096):
    return SimulationConfig(deployment=DeploymentConfig(model="llama-3.1-8b", gpu="h100")).replace(
        engine={"max_model_len": max_model_len, "eos_token_id": EOS})


def _spec(prompt=2000, stream=(5, 6, 7, 8, 9), **params):
    rng = np.random.default_rng(0)
    params = {"max_tokens": len(stream), **params}
    return RequestSpec(0.0, rng.integers(100, 5000, prompt).astype(np.int32), output_token_ids=tuple(stream),
                       sampling_params=SamplingParams(**params), request_id="q")


def _run(first_token, spec, **config):
    cluster = DisaggregatedCluster(_config(**config), DisaggConfig(PoolConfig(1), PoolConfig(1), link="ib-ndr",
                                                                   first_token=first_token))
    out = cluster.run([spec])
    return cluster, out, out.requests.iloc[0]


def test_decode_is_the_default():
    assert DisaggConfig().first_token == "decode"


def test_the_decode_instance_answers_first_after_the_transfer():
    _, out_p, p = _run("prefill", _spec())
    cluster, out_d, d = _run("decode", _spec())
    landed = out_d.transfers.iloc[0].end
    assert p.first_token_time <= out_p.transfers.iloc[0].start         # prefill's token, as the KV starts moving
    assert d.first_token_time > landed                                  # decode's token, one step after it lands
    assert d.ttft_s > p.ttft_s
    decode_steps = cluster.decode[0].records(out_d.results.meta["end_time"]).steps
    assert d.first_token_time == pytest.approx(landed + decode_steps.duration[0])
    assert d.num_output_tokens == p.num_output_tokens == 5
    assert d.e2e_s > p.e2e_s                                            # the decode side samples one more step
    times = out_d.results.token_times[0]
    assert len(times) == 5 and times[0] == d.first_token_time          # every token the client sees is decode's


def test_a_request_its_first_token_stops_still_moves_under_decode():
    spec = _spec(stream=(EOS, 6, 7), max_tokens=3)
    _, out_p, p = _run("prefill", spec)
    _, out_d, d = _run("decode", spec)
    assert out_p.transfers.empty and p.decode_instance == -1           # stopped on the prefill instance
    assert len(out_d.transfers) == 1 and d.decode_instance == 0        # the proxy always forwards
    assert (d.finish_reason, d.num_output_tokens) == (p.finish_reason, p.num_output_tokens) == ("stop", 1)


def test_a_prompt_one_token_short_of_max_model_len_is_answered_by_prefill():
    spec = _spec(prompt=255, stream=(5, 6), max_tokens=None)
    _, out, row = _run("decode", spec, max_model_len=256)
    assert out.transfers.empty and row.decode_instance == -1
    assert (row.finish_reason, row.num_output_tokens) == ("length", 1)


def test_first_token_in_toml_and_named_error(tmp_path):
    path = tmp_path / "pd.toml"
    path.write_text('[disaggregation]\nfirst_token = "prefill"\n')
    assert load_disaggregated(path)[1].first_token == "prefill"
    path.write_text('[disaggregation]\nfirst_token = "proxy"\n')
    with pytest.raises(ConfigError, match="disaggregation.first_token"):
        load_disaggregated(path)
