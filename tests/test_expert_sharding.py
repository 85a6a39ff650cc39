"""Expert parallelism within the TP group (kernels_cost_model/expert_sharding.py, --enable-expert-parallel)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_cost_model import make_cost_model
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import ConfigError
from sim.api.cost_setup import build_cost_model
from sim.api.sections import DeploymentConfig
from sim.cli.main import build_parser
from sim.cli.run import config_from_args


def step(cm, n=32, ctx=1000) -> float:
    return cm.step_time(BatchShape([1] * n, [ctx] * n, n))


def test_dense_models_and_one_gpu_are_unchanged():
    for model, tp in (("llama-3.1-8b", 2), ("mistral-small-24b-fp8", 2), ("qwen3-30b-a3b", 1)):
        assert step(make_cost_model(model, "h100", tp, enable_expert_parallel=True)) == \
            step(make_cost_model(model, "h100", tp))


def test_experts_are_whole_and_split_over_the_ranks():
    cm = make_cost_model("deepseek-v3", "h200", 8, enable_expert_parallel=True)
    assert (cm.base.experts, cm.base.top_k, cm.base.inter_gpu) == (32, 1, 2048)
    tp_only = make_cost_model("deepseek-v3", "h200", 8)
    assert (tp_only.base.experts, tp_only.base.top_k, tp_only.base.inter_gpu) == (256, 8, 256)
    # the same routed FLOPs per rank: rows x width is conserved
    assert cm.base.top_k * cm.base.inter_gpu == tp_only.base.top_k * tp_only.base.inter_gpu


def test_ep_changes_only_the_expert_terms():
    ep = make_cost_model("qwen3-30b-a3b", "h100", 4, enable_expert_parallel=True)
    tp = make_cost_model("qwen3-30b-a3b", "h100", 4)
    batch = BatchShape([1] * 64 + [512], [800] * 64 + [0], 65)
    a, b = ep.breakdown(batch), tp.breakdown(batch)
    assert a["mlp"] != b["mlp"]
    for key in ("qkv_proj", "o_proj", "prefill_attention", "decode_attention", "all_reduce", "lm_head"):
        assert a[key] == b[key], key  # no extra communication at DP 1: TP's all-reduce combines


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 256), ctx=st.integers(1, 20000), more=st.integers(1, 64))
def test_ep_step_grows_with_the_batch(n, ctx, more):
    cm = make_cost_model("qwen3-30b-a3b", "h100", 4, enable_expert_parallel=True)
    assert step(cm, n + more, ctx) >= step(cm, n, ctx)


def test_deployment_field_reaches_the_cost_model():
    cm = build_cost_model(DeploymentConfig(model="qwen3-30b-a3b", gpu="h100", tensor_parallel_size=2,
                                           enable_expert_parallel=True))
    assert cm.experts == 64  # 128 experts over 2 ranks
    with pytest.raises(ConfigError, match="deployment.enable_expert_parallel"):
        DeploymentConfig(enable_expert_parallel="yes")


def test_cli_flag_uses_vllms_name():
    args = build_parser().parse_args(["run", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "8",
                                      "--enable-expert-parallel"])
    assert config_from_args(args).deployment.enable_expert_parallel is True
    args = build_parser().parse_args(["run"])
    assert config_from_args(args).deployment.enable_expert_parallel is False


def test_deepseek_v3_on_8_h200_runs_end_to_end_and_repeats():
    from sim.api.sections import WorkloadConfig
    from sim.api.simulator import SimulationConfig, simulate
    for ep in (False, True):
        cfg = SimulationConfig(deployment=DeploymentConfig(model="deepseek-v3", gpu="h200", tensor_parallel_size=8,
                                                           enable_expert_parallel=ep),
                               workload=WorkloadConfig(rate=4.0, num_requests=40))
        first, again = simulate(cfg).summary, simulate(cfg).summary
        assert first == again and first["completed"] == 40
        assert 5 < first["mean_tpot_ms"] < 200


def test_dp_ep_lockstep_handles_models_beyond_plain_attention():
    from kernels_cost_model.expert_parallel import ExpertParallelCostModel
    base = make_cost_model("deepseek-v3", "h200", 1)  # one engine per GPU (DP attention), experts over 8
    ep = ExpertParallelCostModel(base, 8)
    batch = BatchShape([1] * 32, [2000] * 32, 32)
    terms = ep.rank_breakdown(batch, 8 * 32)
    shared_and_dense = base._mlp(batch, 0.0)
    assert shared_and_dense > 0 and terms["mlp"] > shared_and_dense  # own dense/shared + sharded routed
    assert terms["all_to_all"] > 0 and terms["qkv_proj"] == 0.0       # MLA module fit at 128 heads
    busy = ep.step_time([batch] * 8)
    assert ep.step_time([batch] * 7 + [None]) <= busy         # an idle rank runs the dummy batch
    assert ep.step_time([BatchShape([1] * 64, [2000] * 64, 64)] * 8) > busy
