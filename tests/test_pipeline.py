"""Pipeline parallelism: batches in flight, content invariance, KV conservation, pricing, named errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernels_cost_model.errors import ConfigError
from kernels_cost_model.kv_memory import kv_cache_blocks
from kernels_cost_model.links import get_link
from kernels_cost_model.pipeline import check_pipeline_size, pipeline_kv_cache_blocks, stage_send_time_s
from sim.api.simulator import DeploymentConfig, SimulationConfig, simulate
from sim.core.replay import run_until_stop
from sim.core.sampling_params import SamplingParams
from sim.planning.pipeline import PipelineConfig, simulate_pipeline
from tests.engine_harness import EOS, engine_configs, scripted_specs
from workloads.spec import RequestSpec
from workloads.token_streams import TokenSource


def _none(value):
    return None if isinstance(value, float) and value != value else value


@settings(max_examples=30)
@given(scripted_specs(), engine_configs(), st.sampled_from([1, 2, 4]))
def test_every_request_finishes_once_with_the_tokens_run_until_stop_gives(specs, engine, pp):
    config = SimulationConfig(engine=engine, deployment=DeploymentConfig(cost_model="linear"))
    out = simulate_pipeline(config, PipelineConfig(pp), workload=specs)   # check_invariants every batch
    r = out.requests
    assert sorted(r.request_id) == sorted(s.request_id for s in specs)
    source = TokenSource(EOS)
    for i, spec in enumerate(sorted(specs, key=lambda s: s.arrival_time_s)):
        row = r[r.request_id == spec.request_id].iloc[0]
        stream = [source.token_at(spec, i, k) for k in range(400)]
        expected = run_until_stop(stream, EOS, spec.sampling_params, prompt_len=spec.num_prompt_tokens,
                                  max_model_len=engine.max_model_len, token_text={})
        assert (row.finish_reason, _none(row.stop_reason)) == (expected.finish_reason, expected.stop_reason)
        assert row.num_output_tokens == len(expected.output_token_ids)
    assert out.summary["max_batches_in_flight"] <= pp
    assert out.steps.kv_blocks_used.iloc[-1] == 0 if len(out.steps) else True


def _config(**workload) -> SimulationConfig:
    return SimulationConfig().replace(workload={"rate": 20.0, "num_requests": 150, **workload},
                                      deployment={"model": "llama-3.1-70b", "tensor_parallel_size": 4})


def test_one_stage_is_the_plain_engine():
    sync = _config().replace(engine={"async_scheduling": False})
    assert simulate_pipeline(_config(), PipelineConfig(1)).requests.equals(simulate(sync).requests)


def test_two_stages_keep_two_batches_in_flight_and_serve_more():
    one = simulate_pipeline(_config(), PipelineConfig(1)).summary
    two = simulate_pipeline(_config(), PipelineConfig(2)).summary
    assert two["max_batches_in_flight"] == 2 and two["num_gpus"] == 8
    assert two["output_throughput"] > 1.3 * one["output_throughput"]
    again = simulate_pipeline(_config(), PipelineConfig(2)).summary
    assert again == two


def test_stage_pricing_and_kv_per_stage():
    assert check_pipeline_size("llama-3.1-70b", 4) == 20
    # 8192 tokens x hidden 8192 x 2 bytes over NVLink 4, one rank
    assert stage_send_time_s("llama-3.1-70b", 8192, get_link("nvlink4")) == pytest.approx(2e-6 + 8192 * 8192 * 2 / 450e9)
    pp2 = pipeline_kv_cache_blocks("llama-3.1-70b", "h100", 4, 2)
    assert pp2 > 2 * kv_cache_blocks("llama-3.1-70b", "h100", 4)   # half the weights per GPU, twice the layers' room
    assert pipeline_kv_cache_blocks("llama-3.1-70b", "h100", 4, 1) == kv_cache_blocks("llama-3.1-70b", "h100", 4)
    for kwargs in ({"max_num_seqs": 1024}, {"kv_cache_dtype": "fp8"}, {"cudagraph_memory_bytes": 2**30}):
        one_stage = {"max_num_seqs": kwargs.pop("max_num_seqs", 256), **kwargs}
        assert pipeline_kv_cache_blocks("llama-3.1-70b", "h100", 4, 1, 16, 0.9, 8192, **one_stage) == \
            kv_cache_blocks("llama-3.1-70b", "h100", 4, 16, 0.9, 8192, **one_stage)   # as one instance sizes it


def test_a_pipeline_size_not_dividing_the_layers_is_a_named_error():
    with pytest.raises(ConfigError, match=r"pipeline.pipeline_parallel_size=3: must divide num_layers=80"):
        simulate_pipeline(_config(), PipelineConfig(3))
    with pytest.raises(ConfigError, match="pipeline.link"):
        PipelineConfig(2, link="tin-can")


def test_speculative_decoding_under_pp_is_a_named_error():
    spec = _config().replace(speculative_config={"method": "eagle3", "num_speculative_tokens": 3})
    with pytest.raises(ConfigError) as err:
        simulate_pipeline(spec, PipelineConfig(2))
    assert err.value.field == "speculative_config.method" and err.value.value == "eagle3"
    assert "pipeline_parallel_size=2" in err.value.reason


def test_an_instance_runs_a_hybrid_model_as_simulate_does_and_pp_says_what_it_approximates():
    from sim.planning.instances import InstanceShape, simulate_instance
    config = SimulationConfig(deployment=DeploymentConfig(model="gpt-oss-20b", gpu="h100"),
                              workload={"num_requests": 30, "rate": 20.0})
    plain = simulate(config)
    instance = simulate_instance(config, InstanceShape())  # the topology search's and the pools' path
    assert instance.requests["finish_time"].tolist() == plain.requests["finish_time"].tolist()
    with pytest.warns(UserWarning, match="gpt-oss-20b.*pipeline_parallel_size > 1.*hybrid KV manager"):
        simulate_instance(config, InstanceShape(pipeline=PipelineConfig(2)))


def test_a_prefill_in_flight_gets_its_next_chunk_in_the_next_batch():
    """vLLM V1's scheduler passes over only the requests whose tokens are all scheduled: a long prompt's
    chunks fill consecutive batches (two batches in flight carry chunks of the same request)."""
    import numpy as np
    from sim.core.sampling_params import SamplingParams
    from workloads.spec import RequestSpec
    config = SimulationConfig(engine={"num_gpu_blocks": 400, "max_model_len": 2048, "max_num_batched_tokens": 256},
                              deployment={"cost_model": "linear"})
    spec = RequestSpec(0.0, np.arange(1024, dtype=np.int32) + 100, output_len=4,
                       sampling_params=SamplingParams(max_tokens=4))
    two = simulate_pipeline(config, PipelineConfig(pipeline_parallel_size=2), workload=[spec])
    one = simulate_pipeline(config, PipelineConfig(pipeline_parallel_size=1), workload=[spec])
    assert two.summary["max_batches_in_flight"] == 2
    assert list(two.steps["num_prefill_tokens"][:4]) == [256] * 4
    assert two.requests["ttft_s"].iloc[0] < one.requests["ttft_s"].iloc[0]   # the chunks overlap in the stages


def test_two_requests_that_each_fill_the_cache_finish_under_two_stages():
    """A cache of exactly one max_model_len request and two nearly that long, in 8-token chunks: with the
    requests in flight hidden from the scheduler they preempted each other for ever under PP 2 (each the
    other's victim); as vLLM schedules, the one in flight may be the victim and the older one finishes."""
    import numpy as np
    from sim.core.sampling_params import SamplingParams
    from workloads.spec import RequestSpec
    free = SamplingParams(max_tokens=None)
    specs = [RequestSpec(0.0, (np.arange(133, dtype=np.int32) % 37) + 100, output_len=117, sampling_params=free,
                         request_id="a"),
             RequestSpec(0.2, (np.arange(251, dtype=np.int32) % 37) + 200, output_len=77, sampling_params=free,
                         request_id="b")]
    config = SimulationConfig(
        engine={"block_size": 16, "num_gpu_blocks": 17, "max_model_len": 256, "max_num_seqs": 64,
                "max_num_batched_tokens": 2048, "long_prefill_token_threshold": 8, "enable_prefix_caching": False,
                "scheduler_reserve_full_isl": False, "scheduler_profile": "vllm-0.19", "usage_context": "llm_class",
                "check_invariants": True},
        deployment={"cost_model": "linear"})
    with pytest.warns(UserWarning, match="cut at engine.max_model_len"):
        out = simulate_pipeline(config, PipelineConfig(pipeline_parallel_size=2), workload=specs, until=1e4)
    r = out.requests.set_index("request_id")
    assert r["finish_time"].notna().all()
    assert r.loc["a", "num_output_tokens"] == 117 and r.loc["b", "finish_reason"] == "length"


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_an_empty_batch_leaves_after_the_one_ahead_of_it(mode):
    """A fuzz case: the second batch only preempts a request in flight (no rows, no duration), so its exit is
    the first batch's. The first's timeout fires at now + (exit - now), which rounding puts one ulp past its
    exit (0.0005 + (0.007707375999999999 - 0.0005) == 0.007707376): the empty batch's exit is taken from
    when the first one really fires, not from the sum it was aimed at, so it never leaves first."""
    assert 0.0005 + (0.007707375999999999 - 0.0005) > 0.007707375999999999
    shared = list(range(500, 540))
    specs = [RequestSpec(0.0005, np.asarray([10, 25, 19, 25, 21, 22], np.int32), output_len=1,
                         sampling_params=SamplingParams(max_tokens=None, min_tokens=3, stop=("\x03\x04", "\x0b")),
                         request_id="r0"),
             RequestSpec(0.0005, np.asarray(shared + [10, 12, 7, 22, 24, 38, 5, 4, 19, 14, 18, 15, 16, 12, 38, 25,
                                                      15, 39, 23], np.int32),
                         output_len=9, output_token_ids=(5, 8, 8, 6, 7, 4, 3),
                         sampling_params=SamplingParams(max_tokens=None, min_tokens=3, stop_token_ids=(5, 9)),
                         request_id="r1")]
    config = SimulationConfig(
        engine={"block_size": 4, "num_gpu_blocks": 17, "max_model_len": 64, "max_num_seqs": 6,
                "max_num_batched_tokens": 250, "enable_chunked_prefill": False, "long_prefill_token_threshold": 50,
                "enable_prefix_caching": True, "eos_token_id": 2, "stop_profile": "vllm-v0",
                "usage_context": "openai_api_server", "scheduler_reserve_full_isl": False, "mode": mode},
        deployment={"cost_model": "linear", "model": "qwen2.5-0.5b"})
    results = simulate_pipeline(config, PipelineConfig(2, "pcie4"), workload=specs)
    assert results.requests["finish_reason"].tolist() == ["length", "length"]
    assert results.requests["num_output_tokens"].tolist() == [58, 5]
