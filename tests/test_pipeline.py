"""Pipeline parallelism: batches in flight, content invariance, KV conservation, pricing, named errors."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernels_cost_model.errors import ConfigError
from kernels_cost_model.kv_memory import kv_cache_blocks
from kernels_cost_model.links import get_link
from kernels_cost_model.pipeline import check_pipeline_size, pipeline_kv_cache_blocks, stage_send_time_s
from sim.api.sections import DeploymentConfig
from sim.api.simulator import SimulationConfig, simulate
from sim.core.replay import run_until_stop
from sim.core.sampling_params import SamplingParams
from sim.planning.instances import simulate_pipeline
from sim.planning.pipeline import PipelineConfig
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
    assert check_pipeline_size("llama-3.1-70b", 4) == (20, 20, 20, 20)
    # 8192 tokens x hidden 8192 x 2 bytes over NVLink 4, one rank
    assert stage_send_time_s("llama-3.1-70b", 8192, get_link("nvlink4")) == pytest.approx(2e-6 + 8192 * 8192 * 2 / 450e9)
    pp2 = pipeline_kv_cache_blocks("llama-3.1-70b", "h100", 4, 2)
    assert pp2 > 2 * kv_cache_blocks("llama-3.1-70b", "h100", 4)   # about half the weights per GPU, half the layers
    assert pipeline_kv_cache_blocks("llama-3.1-70b", "h100", 4, 1) == kv_cache_blocks("llama-3.1-70b", "h100", 4)
    for kwargs in ({"max_num_seqs": 1024}, {"kv_cache_dtype": "fp8"}, {"cudagraph_memory_bytes": 2**30}):
        one_stage = {"max_num_seqs": kwargs.pop("max_num_seqs", 256), **kwargs}
        assert pipeline_kv_cache_blocks("llama-3.1-70b", "h100", 4, 1, 16, 0.9, 8192, **one_stage) == \
            kv_cache_blocks("llama-3.1-70b", "h100", 4, 16, 0.9, 8192, **one_stage)   # as one instance sizes it


def test_a_pipeline_size_above_the_layers_is_a_named_error():
    with pytest.raises(ConfigError, match=r"pipeline.pipeline_parallel_size=81: must be at most num_layers=80"):
        simulate_pipeline(_config(), PipelineConfig(81))
    with pytest.raises(ConfigError, match="pipeline.link"):
        PipelineConfig(2, link="tin-can")


def test_speculative_decoding_under_pp_is_a_named_error():
    spec = _config().replace(speculative_config={"method": "eagle3", "num_speculative_tokens": 3})
    with pytest.raises(ConfigError) as err:
        simulate_pipeline(spec, PipelineConfig(2))
    assert err.value.field == "speculative_config.method" and err.value.value == "eagle3"
    assert "pipeline_parallel_size=2" in err.value.reason


def test_an_instance_runs_a_hybrid_model_as_simulate_does_and_keeps_its_groups_under_pp():
    from sim.core.kv_groups import HybridKVCacheManager
    from sim.planning.instances import InstanceShape, build_engine, simulate_instance
    config = SimulationConfig(deployment=DeploymentConfig(model="gpt-oss-20b", gpu="h100"),
                              workload={"num_requests": 30, "rate": 20.0})
    plain = simulate(config)
    instance = simulate_instance(config, InstanceShape())  # the topology search's and the pools' path
    assert instance.requests["finish_time"].tolist() == plain.requests["finish_time"].tolist()
    shape = InstanceShape(pipeline=PipelineConfig(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine, _ = build_engine(shape.config(config), shape)
    assert isinstance(engine.state.kv, HybridKVCacheManager)
    assert [g.kind for g in engine.state.kv.groups] == ["full_attention", "sliding_attention"]


def test_a_hybrid_model_under_pp_is_sized_per_stage_as_vllm_does():
    """gemma-3-27b (62 layers, five sliding then one full, over and over) on H100s, TP1 x PP2: each stage
    holds 31 layers. vLLM groups the whole model: its 10 full layers in one group, its 52 sliding layers
    dealt in turn to 6 groups of at most 10 (group i: sliding layers i, i+6, ...). Stage 0 (layers 0-30)
    holds full layers 5, 11, .., 29 (5) and sliding layers 0-25 (groups 0-1: 5 each, 2-5: 4 each);
    stage 1 holds 5 full layers and sliding 26-51 (groups 2-3: 5, the others 4). A stage's pool block is
    its fullest group's pages: 5 x 16 tokens x 2 (K, V) x 16 KV heads x 128 x 2 bytes, and both stages
    take the fewer blocks (vLLM's get_kv_cache_configs): the last stage's, which holds the tied embedding
    again for its LM head and runs the sampler. All-full, a block held a page of each of 31 layers."""
    from kernels_cost_model.kv_layout import stage_group_sizes
    from kernels_cost_model.kv_memory import (activation_bytes, forward_activation_bytes, kv_layout, non_torch_bytes,
                                              total_memory_bytes)
    from kernels_cost_model.models import get_model
    from kernels_cost_model.stage_weights import stage_weight_bytes
    spec = get_model("gemma-3-27b")
    weights = stage_weight_bytes(spec, 1, "h100", (31, 31))
    budget = total_memory_bytes("h100") * 0.9 - non_torch_bytes(2)
    free = (budget - weights[0] - forward_activation_bytes(spec, 1, 8192),
            budget - weights[1] - activation_bytes(spec, 1, 8192, 256))
    page = 16 * 2 * 16 * 128 * 2
    assert stage_group_sizes(spec, kv_layout("gemma-3-27b"), 2) == (5, 5)
    assert stage_group_sizes(spec, kv_layout("gemma-3-27b"), 1) == (10,)
    assert free[1] < free[0]
    assert pipeline_kv_cache_blocks("gemma-3-27b", "h100", 1, 2) == int(free[1] // (5 * page))
    assert pipeline_kv_cache_blocks("gemma-3-27b", "h100", 1, 2, hybrid_manager=False) == int(free[1] // (31 * page))
    # gpt-oss-20b alternates sliding and full layers: 6 of each group per stage at PP2, 3 at PP4
    gpt = get_model("gpt-oss-20b")
    assert [stage_group_sizes(gpt, kv_layout("gpt-oss-20b"), pp) for pp in (2, 4)] == [(6, 6), (3,) * 4]


def test_an_instance_under_pp_sizes_the_groups_as_the_release_runs_them():
    """gpt-oss-20b, H100, PP2: the hybrid manager's pool block holds 6 layers' pages, twice the blocks of
    every layer as full attention (12 per block), as under vllm-0.19 with a NIXL connector."""
    from sim.planning.instances import InstanceShape
    config = SimulationConfig.from_dict({"deployment": {"model": "gpt-oss-20b", "gpu": "h100"},
                                         "engine": {"scheduler_profile": "vllm-0.19", "max_model_len": 8192}})
    hybrid = InstanceShape(pipeline=PipelineConfig(2)).num_gpu_blocks(config)
    full = InstanceShape(pipeline=PipelineConfig(2), disaggregated=True).num_gpu_blocks(config)
    assert hybrid in (2 * full, 2 * full + 1) and full == pipeline_kv_cache_blocks(
        "gpt-oss-20b", "h100", 1, 2, 16, 0.9, 8192, config.engine.resolved().max_num_seqs, hybrid_manager=False)
    assert InstanceShape(pipeline=PipelineConfig(2), disaggregated=True).num_gpu_blocks(
        config.replace(engine={"scheduler_profile": "vllm-0.33"})) == hybrid   # 0.33 keeps it with NIXL


def test_a_hybrid_run_under_pp_frees_the_window_blocks():
    """gpt-oss-20b under PP2, 12 prompts of 2048 tokens at once in 1100 pool blocks. Every layer as full
    attention a request would hold 2 x 129 blocks (4 fit); the sliding group (window 128) keeps 9 blocks
    once the prompt is in, so 7 run at once, each holding 129 + 9 blocks."""
    config = SimulationConfig.from_dict({"deployment": {"model": "gpt-oss-20b", "gpu": "h100"},
                                         "engine": {"num_gpu_blocks": 1100, "max_model_len": 4096,
                                                    "enable_prefix_caching": False, "check_invariants": True}})
    specs = [RequestSpec(0.0, (np.arange(2048, dtype=np.int32) * 7 + i * 13) % 30000 + 100, output_len=64,
                         sampling_params=SamplingParams(max_tokens=64), request_id=f"r{i}") for i in range(12)]
    out = simulate_pipeline(config, PipelineConfig(2), workload=specs)
    steps = out.steps
    assert steps["num_running"].max() == 7 > 1100 // (2 * 129)
    decoding = steps[(steps["num_running"] == 7) & (steps["num_prefill_tokens"] == 0)]
    assert len(decoding) and (decoding["kv_blocks_used"].iloc[0] == 7 * (129 + 9))
    assert out.requests["finish_time"].notna().all()
    assert simulate_pipeline(config, PipelineConfig(2), workload=specs).requests.equals(out.requests)


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
