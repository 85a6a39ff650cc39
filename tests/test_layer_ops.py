"""Cost of the shapes beyond plain attention (kernels_cost_model/layer_ops.py)."""
from __future__ import annotations

import dataclasses

import pytest

from kernels_cost_model import get_model, make_cost_model
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.cost_model import RooflineCostModel


def decode(n: int, ctx: int) -> BatchShape:
    return BatchShape(num_new_tokens=[1] * n, num_context_tokens=[ctx] * n, num_sampled=n)


def attention(cm, batch) -> float:
    b = cm.breakdown(batch)
    return b["decode_attention"] + b["prefill_attention"]


def test_plain_models_keep_the_roofline_model():
    assert type(make_cost_model("llama-3.1-8b", "h100", calibration=None)) is RooflineCostModel


def test_breakdown_adds_up_and_every_new_model_prices_a_step():
    for name in ("deepseek-v3", "gpt-oss-120b", "gemma-3-27b", "qwen3-next-80b-a3b", "llama-4-scout",
                 "mistral-small-24b-fp8"):
        cm = make_cost_model(name, "h200", 8 if name == "deepseek-v3" else 1, calibration=None)
        batch = BatchShape(num_new_tokens=[1, 1, 300], num_context_tokens=[900, 20000, 0], num_sampled=3)
        assert sum(cm.breakdown(batch).values()) == pytest.approx(cm.step_time(batch))
        assert cm.breakdown(batch)["mlp"] > 0 and cm.step_time(batch) > 0


def test_sliding_layers_stop_growing_past_the_window():
    # gpt-oss: 18 sliding (window 128) + 18 full layers; beyond the window only the full layers grow
    cm = make_cost_model("gpt-oss-120b", "h100", calibration=None)
    full_only = make_cost_model(dataclasses.replace(get_model("gpt-oss-120b"),
                                                    layer_types=("full_attention",) * 36), "h100",
                                calibration=None)
    grow = attention(cm, decode(64, 60000)) - attention(cm, decode(64, 30000))
    grow_full = attention(full_only, decode(64, 60000)) - attention(full_only, decode(64, 30000))
    assert grow == pytest.approx(grow_full / 2, rel=0.02)


def test_linear_attention_layers_cost_the_same_at_any_context():
    cm = make_cost_model("qwen3-next-80b-a3b", "h200", calibration=None)
    spec = get_model("qwen3-next-80b-a3b")
    all_full = make_cost_model(dataclasses.replace(spec, layer_types=("full_attention",) * 48), "h200",
                               calibration=None)
    grow = attention(cm, decode(32, 100000)) - attention(cm, decode(32, 1000))
    grow_full = attention(all_full, decode(32, 100000)) - attention(all_full, decode(32, 1000))
    assert grow == pytest.approx(grow_full / 4, rel=0.02)   # 12 of 48 layers are full attention


def test_mla_decode_reads_the_latent_not_per_head_kv():
    # absorbed decode: 576 latent values per key for all 16 heads on a GPU, not 16 x (192 + 128)
    cm = make_cost_model("deepseek-v3", "h200", 8, calibration=None)
    batch = decode(128, 8000)
    assert cm.base.kv_gpu == 288 and cm.prefill_base.kv_gpu == 16 * 160
    assert attention(cm, batch) < attention(cm.prefill_base, batch) / 4


def test_fp8_weights_halve_memory_bound_matmuls():
    bf16 = make_cost_model("mistral-small-24b", "h100", calibration=None)
    fp8 = make_cost_model("mistral-small-24b-fp8", "h100", calibration=None)
    one = decode(1, 100)
    assert fp8.breakdown(one)["mlp"] == pytest.approx(bf16.breakdown(one)["mlp"] / 2, rel=0.05)
    big = BatchShape(num_new_tokens=[8192], num_context_tokens=[0], num_sampled=1)  # compute-bound
    assert fp8.breakdown(big)["mlp"] < 0.6 * bf16.breakdown(big)["mlp"]           # FP8 peak = 2x BF16


def test_shared_experts_add_mlp_work_and_dense_layers_are_priced_as_dense():
    spec = get_model("deepseek-v3")
    cm = make_cost_model(spec, "h200", 8, calibration=None)
    no_shared = make_cost_model(dataclasses.replace(spec, n_shared_experts=0, shared_expert_intermediate_size=0),
                                "h200", 8, calibration=None)
    all_moe = make_cost_model(dataclasses.replace(spec, first_k_dense_replace=0), "h200", 8, calibration=None)
    mlp = cm.breakdown(decode(8, 100))["mlp"]
    assert mlp > no_shared.breakdown(decode(8, 100))["mlp"]
    # at decode, a dense layer reads one MLP's weights; an MoE layer reads up to 8 x 8 routed experts'
    assert mlp < all_moe.breakdown(decode(8, 100))["mlp"]
