"""Pipeline stages as vLLM builds them: its layer partition, each stage's weights and KV blocks, each
stage's time, and batches through unequal stages."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import assume, given, settings, strategies as st

from kernels_cost_model import make_cost_model
from kernels_cost_model.architectures import END_STAGES, EVERY_STAGE, architecture_of, ends_on_every_stage
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import ConfigError
from kernels_cost_model.kv_memory import weight_bytes_per_gpu
from kernels_cost_model.model_shapes import split_params
from kernels_cost_model.models import get_model, list_models
from kernels_cost_model.pipeline import (check_pipeline_size, layer_partition, pipeline_kv_cache_blocks,
                                         stage_kv_cache_blocks)
from kernels_cost_model.stage_times import split_by_layers, stage_times
from kernels_cost_model.stage_weights import end_params, layer_params, stage_weight_bytes
from sim.api.simulator import SimulationConfig
from sim.core.cost import LinearCostModel
from sim.planning.instances import simulate_pipeline
from sim.planning.pipeline import PipelineConfig, PipelineProcess


# ----- the partition (vllm/distributed/utils.py get_pp_indices) ---------------------------------------
@pytest.mark.parametrize("layers, pp, expected", [
    (61, 2, (31, 30)), (61, 4, (15, 15, 16, 15)), (80, 3, (27, 27, 26)), (32, 4, (8, 8, 8, 8)),
    (10, 4, (2, 3, 3, 2)), (7, 7, (1,) * 7), (62, 4, (15, 16, 16, 15))])
def test_the_partition_is_vllms(layers, pp, expected):
    assert layer_partition(layers, pp) == expected


@given(st.integers(1, 200), st.integers(1, 64))
def test_the_remainder_goes_to_the_stages_before_the_last(layers, pp):
    assume(pp <= layers)   # (more stages than layers: a named error, test_pipeline.py)
    parts = layer_partition(layers, pp)
    floor, extra = divmod(layers, pp)
    assert sum(parts) == layers and len(parts) == pp and parts[-1] == floor
    assert [i for i, n in enumerate(parts) if n == floor + 1] == list(range(pp - 1 - extra, pp - 1))
    assert all(n in (floor, floor + 1) for n in parts)


def test_a_pp_that_does_not_divide_the_layers_runs():
    assert check_pipeline_size("llama-3.1-70b", 3) == (27, 27, 26)
    assert check_pipeline_size("llama-3.1-70b", 3, (30, 30, 20)) == (30, 30, 20)


@pytest.mark.parametrize("partition, match", [
    ((40, 0), r"pipeline.layer_partition=\(40, 0\): must be a sequence of integers >= 1"),
    ((40, 20, 20), r"pipeline.layer_partition=\(40, 20, 20\): has 3 entries; pipeline_parallel_size=2"),
    ("40,40", r"pipeline.layer_partition='40,40': must be a sequence of integers >= 1"),
    ((40, 2.5), r"pipeline.layer_partition=\(40, 2.5\)")])
def test_a_bad_layer_partition_is_a_named_error(partition, match):
    with pytest.raises(ConfigError, match=match):
        PipelineConfig(2, layer_partition=partition)


def test_a_layer_partition_must_add_up_to_the_models_layers():
    config = SimulationConfig().replace(deployment={"model": "llama-3.1-8b", "cost_model": "linear"},
                                        workload={"num_requests": 5})
    with pytest.raises(ConfigError, match=r"pipeline.layer_partition=\(20, 20\): adds up to 40 layers; "
                                          r"the model has num_layers=32"):
        simulate_pipeline(config, PipelineConfig(2, layer_partition=(20, 20)))
    out = simulate_pipeline(config, PipelineConfig(2, layer_partition=[20, 12]))
    assert out.meta["pipeline"]["layer_partition"] == [20, 12]


# ----- weights per stage ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list_models())
def test_layers_and_ends_add_up_to_the_models_parameters(name):
    spec = get_model(name)
    whole = spec.num_params() if spec.is_plain else sum(split_params(spec))
    assert sum(d + e for d, e in layer_params(spec)) + end_params(spec, True, True) == whole


def test_tied_embeddings_are_held_once_on_one_stage_and_on_both_ends_under_pp():
    """qwen2.5-0.5b ties its embeddings: one table at PP 1; at PP 2 the last stage builds one beside the
    first stage's (vLLM's LlamaModel/Qwen2Model: embed_tokens on the first rank, or the last if tied)."""
    spec = get_model("qwen2.5-0.5b")
    table = spec.vocab_size * spec.hidden_size * spec.dtype_bytes
    assert stage_weight_bytes(spec, 1, "h100", (24,)) == (weight_bytes_per_gpu(spec, 1, "h100"),)
    assert sum(stage_weight_bytes(spec, 1, "h100", (12, 12))) == weight_bytes_per_gpu(spec, 1, "h100") + table
    untied = get_model("llama-3.1-8b")
    assert sum(stage_weight_bytes(untied, 1, "h100", (16, 16))) == weight_bytes_per_gpu(untied, 1, "h100")


def test_moe_stages_hold_their_layers_experts():
    """DeepSeek-V3's first 3 layers are dense, so the first stage holds fewer experts; gpt-oss-20b's MXFP4
    experts are laid out per stage as for the whole model (and, as vLLM's GptOssModel builds them on every
    rank, each stage holds the embedding, final norm and LM head)."""
    ds = get_model("deepseek-v3")
    first, last = stage_weight_bytes(ds, 8, None, (31, 30))
    assert [e for _, e in layer_params(ds)[:4]] == [0, 0, 0, layer_params(ds)[3][1]] and first < last
    gpt = get_model("gpt-oss-20b")
    ends = end_params(gpt, True, True) * (gpt.weight_bytes or gpt.dtype_bytes)
    assert sum(stage_weight_bytes(gpt, 1, "h100", (12, 12))) == pytest.approx(
        weight_bytes_per_gpu(gpt, 1, "h100") + ends, abs=2)


# ----- embedding and LM head per architecture (kernels_cost_model.architectures) ----------------------------
def test_every_catalog_model_has_a_vllm_class_whose_placement_is_known():
    for name in list_models():
        assert get_model(name).architecture in END_STAGES | EVERY_STAGE, name


@pytest.mark.parametrize("cfg, expected", [
    ({"architectures": ["MixtralForCausalLM"], "model_type": "llama"}, "MixtralForCausalLM"),
    ({"model_type": "qwen3_moe"}, "Qwen3MoeForCausalLM"),
    ({"model_type": "unknown", "text_config": {"model_type": "gemma3_text"}}, "Gemma3ForCausalLM"),
    ({"model_type": "something_new"}, ""), ({}, "")])
def test_a_configs_class_is_its_architectures_else_its_model_type(cfg, expected):
    assert architecture_of(cfg) == expected


def test_llama_family_stages_hold_the_embedding_first_and_the_head_last():
    """vLLM's LlamaModel / Qwen2Model / DeepseekV2Model: the embedding on the first rank (and the last when
    tied), the final norm and LM head on the last; the middle stages hold neither."""
    for name in ("llama-3.1-8b", "mistral-7b", "qwen2.5-7b", "qwen3-32b", "deepseek-v3", "llama-4-scout"):
        spec = get_model(name)
        table = spec.vocab_size * spec.hidden_size
        assert not ends_on_every_stage(spec.architecture), name
        assert (end_params(spec, True, False), end_params(spec, False, False), end_params(spec, False, True)) == (
            table, 0, table + spec.hidden_size), name


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "gemma-3-27b", "qwen3-next-80b-a3b"])
def test_models_whose_vllm_class_builds_the_ends_on_every_rank_hold_them_on_every_stage(name):
    """Mixtral, Qwen3-MoE, gpt-oss, Gemma 3, Qwen3-Next: vLLM builds embed_tokens, norm and lm_head
    unconditionally, so every stage (a middle one too) holds both tables, or one when tied (Gemma 3)."""
    spec = get_model(name)
    tables = 1 if spec.tie_word_embeddings else 2
    every = tables * spec.vocab_size * spec.hidden_size + spec.hidden_size
    assert [end_params(spec, i == 0, i == 3) for i in range(4)] == [every] * 4


def test_a_middle_mixtral_stage_holds_both_tables():
    """By hand, Mixtral-8x7B at TP 1 x PP 4 (8 layers a stage, bf16): a stage's weights are its 8 layers
    plus two 32000 x 4096 tables and the final norm's 4096, the middle ones too."""
    spec = get_model("mixtral-8x7b")
    layer = sum(d for d, _ in layer_params(spec)[:1])
    weights = stage_weight_bytes(spec, 1, "h100", (8, 8, 8, 8))
    assert weights == (2 * (8 * layer + 2 * 32000 * 4096 + 4096),) * 4


# ----- KV blocks per stage -------------------------------------------------------------------------------
def _llama_8b_blocks(stage_params: tuple, layers_per_stage: int) -> tuple[int, ...]:
    """Llama-3.1-8B on one H100 per stage, by hand: per layer 4096 x (4096 + 2 x 1024) + 4096 x 4096 (attention)
    + 3 x 4096 x 14336 (MLP) + 2 x 4096 (norms) = 218,112,000 parameters; the embedding and the LM head
    128,256 x 4096 each, the final norm 4096; bf16. Activation peak: the forward pass, 8192 tokens x
    (4 x 4096 + 6144 + 3 x 14336) x 2 bytes = 1 GiB, on every stage; the last also samples: 8192 x 4096 x 2
    + 38.4 x 256 x 128,256 = 1,327,916,646 bytes. Non-torch 0.55 GiB. A block: 16 tokens x 2 x 8 heads x
    128 x 2 bytes per layer of the stage."""
    budget = 85_017_493_504 * 0.9
    activation = [1 << 30] * (len(stage_params) - 1) + [1_327_916_646]
    block = 16 * 4096 * layers_per_stage
    return tuple(int((budget - 2 * p - a - round(0.55 * 2**30)) // block) for p, a in zip(stage_params, activation))


def test_llama_8b_stages_hold_the_blocks_a_hand_computation_gives():
    layer, table = 218_112_000, 128_256 * 4096
    pp2 = _llama_8b_blocks((16 * layer + table, 16 * layer + table + 4096), 16)
    pp4 = _llama_8b_blocks((8 * layer + table, 8 * layer, 8 * layer, 8 * layer + table + 4096), 8)
    assert stage_kv_cache_blocks("llama-3.1-8b", "h100", 1, 2) == pp2 == (63725, 63483)
    assert stage_kv_cache_blocks("llama-3.1-8b", "h100", 1, 4) == pp4
    # the last stage (LM head, sampler) has the least room and sets every stage's count
    assert pipeline_kv_cache_blocks("llama-3.1-8b", "h100", 1, 2) == min(pp2) == pp2[-1]
    assert pipeline_kv_cache_blocks("llama-3.1-8b", "h100", 1, 4) == min(pp4) == pp4[-1]
    assert pp4[1] == pp4[2] > pp4[0] > pp4[3]   # the middle stages hold no embedding or head


def test_the_stage_with_the_least_room_sets_the_count():
    heavy_first = stage_kv_cache_blocks("llama-3.1-8b", "h100", 1, 2, layer_partition=(20, 12))
    assert heavy_first[0] < heavy_first[1]
    assert pipeline_kv_cache_blocks("llama-3.1-8b", "h100", 1, 2, layer_partition=(20, 12)) == heavy_first[0]


def test_every_stage_reserves_the_same_cuda_graph_figure():
    """cudagraph_memory_gib is a user's figure per GPU, taken from each stage's room alike."""
    from kernels_cost_model.pipeline import stage_free_bytes
    without = stage_free_bytes("llama-3.1-70b", "h100", 4, (27, 27, 26))
    graphs = stage_free_bytes("llama-3.1-70b", "h100", 4, (27, 27, 26), cudagraph_memory_bytes=3 * 2**30)
    assert [a - b for a, b in zip(without, graphs)] == [3 * 2**30] * 3


def test_a_stage_with_no_room_is_named():
    """At 11.6 % of an H100 the first stage of Llama-3.1-8B fits, the last (LM head and sampler) not."""
    with pytest.raises(ConfigError, match=r"stage 1 \(layers 16-31, the final norm and LM head\) needs"):
        pipeline_kv_cache_blocks("llama-3.1-8b", "h100", 1, 2, gpu_memory_utilization=0.116)


def test_a_stage_with_no_room_names_the_tables_it_holds():
    """Mixtral's vLLM class builds the embedding, final norm and LM head on every rank: the first stage
    with no room names all three (a Llama first stage holds the embedding alone)."""
    with pytest.raises(ConfigError, match=r"stage 0 \(layers 0-7, the embedding, the final norm and LM head\)"):
        pipeline_kv_cache_blocks("mixtral-8x7b", "h100", 1, 4, gpu_memory_utilization=0.3)


def test_a_hybrid_model_takes_its_groups_per_uneven_stage():
    """gemma-3-27b at PP 4: vLLM's partition (15, 16, 16, 15); each stage's block its fullest group there."""
    from kernels_cost_model.kv_layout import stage_group_sizes
    from kernels_cost_model.kv_memory import kv_layout
    spec = get_model("gemma-3-27b")
    sizes = stage_group_sizes(spec, kv_layout(spec), (15, 16, 16, 15))
    assert stage_group_sizes(spec, kv_layout(spec), 4) == sizes and len(sizes) == 4 and max(sizes) <= 10


# ----- time per stage ------------------------------------------------------------------------------------
BATCHES = [BatchShape([1] * 64, [1000] * 64, 64), BatchShape([2048, 1, 1], [0, 500, 500], 2),
           BatchShape([512], [0], 0), BatchShape([], [], 0)]


@pytest.mark.parametrize("name, tp", [("llama-3.1-70b", 4), ("qwen2.5-0.5b", 1), ("gpt-oss-20b", 1),
                                      ("qwen3-next-80b-a3b", 2), ("gemma-3-27b", 1), ("deepseek-v3", 8)])
def test_stage_times_add_up_to_the_step_time(name, tp):
    cost = make_cost_model(name, "h100", tp)
    layers = cost.model.num_layers
    for pp in (2, 3, 4):
        for batch in BATCHES:
            times = stage_times(cost, batch, layer_partition(layers, pp))
            assert len(times) == pp and min(times) >= 0
            assert math.fsum(times) == pytest.approx(cost.step_time(batch), rel=1e-12, abs=1e-15)


def test_the_last_stage_of_a_small_model_is_the_slowest_on_decode():
    """qwen2.5-0.5b (hidden 896, vocabulary 151,936): its LM head outweighs the embedding's lookup; the
    engine's CPU time sits on the first stage (left out here: `cpu_overhead=False`)."""
    cost = make_cost_model("qwen2.5-0.5b", "h100", cpu_overhead=False)
    first, last = stage_times(cost, BatchShape([1] * 64, [1000] * 64, 64), (12, 12))
    assert last > first
    with_cpu = make_cost_model("qwen2.5-0.5b", "h100")
    first_cpu, last_cpu = stage_times(with_cpu, BatchShape([1] * 64, [1000] * 64, 64), (12, 12))
    cpu = with_cpu.breakdown(BatchShape([1] * 64, [1000] * 64, 64))["cpu"]
    assert last_cpu == last and first_cpu == pytest.approx(first + cpu, rel=1e-12)


def test_other_cost_models_split_the_step_by_layers():
    linear, batch = LinearCostModel(), BatchShape([100, 1], [0, 50], 2)
    step = linear.step_time(batch)
    assert stage_times(linear, batch, (16, 16)) == (step / 2, step / 2)
    assert stage_times(linear, batch, (20, 12)) == (step * 20 / 32, step * 12 / 32)
    assert split_by_layers(1.0, (8, 8, 8, 8)) == (0.25,) * 4


# ----- batches through unequal stages ------------------------------------------------------------------
def _stages(pp: int, even: bool = False):
    return SimpleNamespace(stage_free=[0.0] * pp, stages=pp, even=even)


def _recursion(free: list, now: float, seconds, send: float) -> float:
    done = now
    for j, s in enumerate(seconds):
        done = max(done + send if j else done, free[j]) + s
        free[j] = done
    return done


batches = st.lists(st.tuples(st.floats(0, 1), st.lists(st.floats(0, 0.05), min_size=4, max_size=4),
                             st.floats(0, 0.01)), min_size=1, max_size=30)


@settings(max_examples=200)
@given(batches, st.integers(2, 4))
def test_a_batch_enters_a_stage_once_it_left_the_one_before_and_the_stage_is_free(plan, pp):
    proc, reference = _stages(pp), [0.0] * pp
    now = 0.0
    for gap, seconds, send in plan:
        now = max(now + gap, proc.stage_free[0])   # the scheduler plans when the first stage is free
        before = list(proc.stage_free)
        exit_at = PipelineProcess._enter(proc, now, tuple(seconds[:pp]), send)
        assert exit_at == pytest.approx(_recursion(reference, now, seconds[:pp], send), rel=1e-12, abs=1e-12)
        ends = proc.stage_free
        for j in range(pp):   # never two batches on one stage: it starts after the one ahead has done
            start = ends[j] - seconds[j]
            assert start >= before[j] - 1e-12 and (j == 0 or start >= ends[j - 1] + send - 1e-12)
        assert exit_at >= before[-1]   # leaves after the batch ahead


@settings(max_examples=200)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 0.2), st.floats(0, 0.01)), min_size=1, max_size=40),
       st.integers(2, 6))
def test_even_stages_leave_exactly_when_the_even_formula_said(plan, pp):
    """Even stages: each exit is bit for bit the former closed form max(now + PP x stage + sends, last exit
    + stage) (servesim before per-stage times)."""
    proc, last_exit, now = _stages(pp, even=True), 0.0, 0.0
    for gap, duration, send in plan:
        now = max(now + gap, proc.stage_free[0])
        stage = duration / pp
        expected = max(now + pp * stage + (pp - 1) * send, last_exit + stage)
        assert PipelineProcess._enter(proc, now, split_by_layers(duration, (3,) * pp), send) == expected
        last_exit = expected


@pytest.mark.parametrize("cost_model, partition", [("linear", (5, 20, 7)), ("roofline", None)])
def test_a_run_through_unequal_stages_keeps_one_batch_per_stage_and_reruns_identically(monkeypatch, cost_model,
                                                                                       partition):
    trace = []
    enter = PipelineProcess._enter

    def recorded(self, now, seconds, send_s):
        before = list(self.stage_free)
        exit_at = enter(self, now, seconds, send_s)
        trace.append((before, list(self.stage_free), seconds, send_s))
        return exit_at

    monkeypatch.setattr(PipelineProcess, "_enter", recorded)
    config = SimulationConfig().replace(
        deployment={"model": "qwen2.5-0.5b" if partition is None else "llama-3.1-8b", "cost_model": cost_model},
        workload={"rate": 30.0, "num_requests": 60},
        engine={"num_gpu_blocks": 3000, "max_model_len": 16384})
    pipeline = PipelineConfig(3 if partition is None else len(partition), "pcie4", partition)
    out = simulate_pipeline(config, pipeline)
    assert out.requests["finish_time"].notna().all() and out.summary["max_batches_in_flight"] == 3
    for before, after, seconds, send in trace:
        assert all(a - s >= b - 1e-12 for a, s, b in zip(after, seconds, before))
        assert after[-1] >= before[-1]
    assert len(set(tuple(s) for _, _, s, _ in trace if sum(s))) > 1
    monkeypatch.setattr(PipelineProcess, "_enter", enter)
    assert simulate_pipeline(config, pipeline).requests.equals(out.requests)


# ----- where a pipeline is configured --------------------------------------------------------------------
def test_a_pool_and_the_cli_take_a_layer_partition():
    from argparse import Namespace
    from sim.cli.topology_flags import instance_shape
    from sim.planning.disagg_config import DisaggConfig
    pools = DisaggConfig.from_dict({"decode": {"pipeline_parallel_size": 2, "pipeline_layer_partition": [20, 12]}})
    assert pools.decode.shape.pipeline.layer_partition == (20, 12)
    with pytest.raises(ConfigError, match=r"disaggregation.decode.pipeline_layer_partition=\[20\]: needs "
                                          r"pipeline_parallel_size > 1"):
        DisaggConfig.from_dict({"decode": {"pipeline_layer_partition": [20]}})
    with pytest.raises(ConfigError, match=r"disaggregation.prefill.pipeline_layer_partition=\[20, 0\]"):
        DisaggConfig.from_dict({"prefill": {"pipeline_parallel_size": 2, "pipeline_layer_partition": [20, 0]}})
    args = Namespace(pp=2, pipeline_link="nvlink4", pipeline_layer_partition="20,12", kv_offloading_size=None,
                     kv_offloading_link="pcie5")
    assert instance_shape(args).pipeline.layer_partition == (20, 12)
    for text, reason in (("20,x", "comma-separated"), ("20,12,4", "3 entries")):
        with pytest.raises(ConfigError, match=rf"--pipeline-layer-partition=.*{reason}"):
            instance_shape(Namespace(**{**vars(args), "pipeline_layer_partition": text}))
    with pytest.raises(ConfigError, match="--pipeline-layer-partition='20,12': needs --pipeline-parallel-size > 1"):
        instance_shape(Namespace(**{**vars(args), "pp": None}))
