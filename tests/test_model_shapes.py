"""Model shapes beyond plain attention: config.json parsing, and KV capacity per attention type checked
against a hand computation from each model's config.json figures (kernels_cost_model/data/models_modern.json)."""
from __future__ import annotations

import json

import pytest

from kernels_cost_model import get_model, kv_bytes_per_token, kv_cache_blocks, kv_layout
from kernels_cost_model._catalog import read_config_catalog
from kernels_cost_model.errors import ConfigError
from kernels_cost_model.kv_layout import MLA
from kernels_cost_model.model_shapes import CHUNKED, FULL, LINEAR, SLIDING


@pytest.mark.parametrize("entry", read_config_catalog("models_modern.json"), ids=lambda e: e["name"])
def test_catalog_entry_equals_its_config_json_read_from_disk(entry, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(entry["config"]))
    from_file, from_catalog = get_model(str(path)), get_model(entry["name"])
    assert from_file.__class__(**{**_fields(from_file), "name": "", "source": ""}) == \
        from_catalog.__class__(**{**_fields(from_catalog), "name": "", "source": ""})


def _fields(spec) -> dict:
    return {f: getattr(spec, f) for f in spec.__slots__}


def test_full_attention_gqa_mistral_small():
    # 40 layers x 8 KV heads x head_dim 128 x (K, V) x 2 bytes (BF16)
    assert kv_bytes_per_token("mistral-small-24b") == 2 * 40 * 8 * 128 * 2
    assert kv_bytes_per_token("mistral-small-24b", 1, "fp8") == 2 * 40 * 8 * 128   # fp8 halves it
    assert kv_layout("mistral-small-24b").groups == kv_layout("mistral-small-24b-fp8").groups


def test_mla_deepseek_v3_latent_is_replicated_over_tp():
    # 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes, the same on each of 8 GPUs
    for tp in (1, 8):
        assert kv_bytes_per_token("deepseek-v3", tp) == 61 * (512 + 64) * 2
    layout = kv_layout("deepseek-v3", 8)
    assert [(g.kind, g.num_layers) for g in layout.groups] == [(MLA, 61)]
    assert layout.block_bytes == 16 * 61 * 576 * 2


def test_sliding_window_gpt_oss_groups_and_block_bytes():
    # 36 layers alternating sliding (window 128) and full; 8 KV heads x head_dim 64
    layout = kv_layout("gpt-oss-120b", 1, 16)
    assert [(g.kind, g.num_layers, g.window) for g in layout.groups] == [(FULL, 18, 0), (SLIDING, 18, 128)]
    page = 16 * 2 * 8 * 64 * 2
    assert layout.page_bytes == page and layout.block_bytes == 18 * page
    assert layout.tokens(1000) == 500 * 16         # vLLM reports blocks per group x block_size


def test_gemma3_five_local_per_global_layer():
    # 62 layers, every 6th global: 10 full + 52 sliding (window 1024); group size 10 -> 1 + 6 groups
    spec = get_model("gemma-3-27b")
    assert spec.layer_types.count(FULL) == 10 and spec.layer_types[5] == FULL and spec.layer_types[0] == SLIDING
    layout = kv_layout(spec, 1, 16)
    assert [g.kind for g in layout.groups] == [FULL] + [SLIDING] * 6
    assert layout.block_bytes == 10 * 16 * 2 * 16 * 128 * 2


def test_chunked_local_attention_llama4_scout():
    layout = kv_layout("llama-4-scout", 4, 16)
    assert [(g.kind, g.num_layers, g.window) for g in layout.groups] == [(FULL, 12, 0)] + [(CHUNKED, 12, 8192)] * 3
    assert layout.page_bytes == 16 * 2 * 2 * 128 * 2   # 8 KV heads over TP 4


def test_linear_attention_state_qwen3_next():
    # Gated DeltaNet: conv (2 x 16x128 + 32x128) x (4 - 1) + recurrent 32 x 128 x 128, BF16, per request/layer
    state = ((2 * 16 * 128 + 32 * 128) * 3 + 32 * 128 * 128) * 2
    page = 16 * 2 * 2 * 256 * 2                        # full layers: 2 KV heads x head_dim 256
    layout = kv_layout("qwen3-next-80b-a3b", 1, 16)
    assert [g.kind for g in layout.groups] == [FULL, LINEAR, LINEAR, LINEAR]
    assert all(g.state_blocks == -(-state // page) for g in layout.groups[1:])
    assert layout.block_bytes == 12 * page


def _qwen3_next_config(tmp_path, **extra):
    entry = next(e for e in read_config_catalog("models_modern.json") if e["name"] == "qwen3-next-80b-a3b")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**entry["config"], **extra}))
    return get_model(str(path))


def test_linear_recurrent_state_follows_mamba_ssm_dtype(tmp_path):
    """vLLM keeps the GDN recurrent state in the model dtype (mamba_ssm_cache_dtype "auto"): Qwen3-Next's
    config.json names no mamba_ssm_dtype, so BF16. A config.json that does (Qwen3.5: "float32") gets it,
    as vLLM's Qwen3.5 config hook does; the conv state stays in the model dtype."""
    from kernels_cost_model import make_cost_model
    from kernels_cost_model.kv_layout import linear_state_bytes
    conv, recurrent = (2 * 16 * 128 + 32 * 128) * 3, 32 * 128 * 128          # per request and layer, TP 1
    bf16 = _qwen3_next_config(tmp_path)
    assert linear_state_bytes(bf16, 1) == (conv + recurrent) * 2 == 1_097_728
    assert linear_state_bytes(bf16, 2) == (conv // 2 + recurrent // 2) * 2
    fp32 = _qwen3_next_config(tmp_path, mamba_ssm_dtype="float32")
    assert fp32.ssm_state_dtype_bytes == 4
    assert linear_state_bytes(fp32, 1) == conv * 2 + recurrent * 4 == 2_146_304
    page = 16 * 2 * 2 * 256 * 2
    assert kv_layout(fp32, 1, 16).groups[1].state_blocks == -(-2_146_304 // page)
    # the decode step reads and writes the state: roofline and measured fits both see the larger state
    rough = [make_cost_model(m, "h200", 2, calibration=None) for m in (bf16, fp32)]
    assert rough[1].linear_state_bytes == 2 * rough[0].linear_state_bytes - conv // 2 * 2
    fitted = [make_cost_model(m, "h200", 2) for m in (bf16, fp32)]
    assert (fitted[0].gdn.state_bytes, fitted[1].gdn.state_bytes) == (2.0, 4.0)
    assert fitted[1].gdn.decode(512) > 1.3 * fitted[0].gdn.decode(512)


def test_fp8_and_mxfp4_weights_leave_more_room_for_kv():
    assert get_model("deepseek-v3").weight_bytes_total() == pytest.approx(get_model("deepseek-v3").num_params())
    bf16 = kv_cache_blocks("mistral-small-24b", "h100")
    fp8 = kv_cache_blocks("mistral-small-24b-fp8", "h100")
    assert fp8 * kv_layout("mistral-small-24b-fp8").block_bytes - bf16 * kv_layout("mistral-small-24b").block_bytes \
        == pytest.approx(get_model("mistral-small-24b").num_params(), rel=0.01)
    oss = get_model("gpt-oss-120b")
    assert oss.weight_bytes_total() < 0.6 * oss.num_params()   # MXFP4 experts: ~4.25 bits per weight


def test_parameter_counts_match_the_model_cards():
    # published totals: DeepSeek-V3 671B, gpt-oss-120b 116.8B (OpenAI model card), Qwen3-Next 80B
    assert get_model("deepseek-v3").num_params() / 1e9 == pytest.approx(671, rel=0.01)
    assert get_model("gpt-oss-120b").num_params() / 1e9 == pytest.approx(116.8, rel=0.01)
    assert get_model("qwen3-next-80b-a3b").num_params() / 1e9 == pytest.approx(80, rel=0.02)


def test_bad_kv_cache_dtype_names_the_field():
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        kv_bytes_per_token("gpt-oss-20b", 1, "int4")


def test_max_concurrency_counts_only_the_window_of_sliding_layers():
    layout = kv_layout("gpt-oss-120b", 1, 16)
    # 8192 tokens: 512 blocks in the full group, ceil(127 / 16) + 1 = 9 in the sliding group
    assert layout.blocks_per_request(8192) == 512 + 9
    assert layout.max_concurrency(5210, 8192) == 10
    qwen = kv_layout("qwen3-next-80b-a3b", 1, 16)
    assert qwen.blocks_per_request(8192) == 512 + 3 * qwen.groups[1].state_blocks


def test_deployment_kv_cache_dtype_and_groups_reach_the_engine():
    from sim.api.sections import DeploymentConfig
    from sim.api.simulator import SimulationConfig, resolve_kv_groups, resolve_num_gpu_blocks
    auto = SimulationConfig(deployment=DeploymentConfig(model="gpt-oss-20b", gpu="h100"))
    fp8 = SimulationConfig(deployment=DeploymentConfig(model="gpt-oss-20b", gpu="h100", kv_cache_dtype="fp8"))
    assert resolve_num_gpu_blocks(fp8) == pytest.approx(2 * resolve_num_gpu_blocks(auto), abs=1)
    assert [g.kind for g in resolve_kv_groups(auto)] == [FULL, SLIDING]
    assert resolve_kv_groups(SimulationConfig()) is None          # plain model: the plain manager
    with pytest.raises(ConfigError, match="deployment.kv_cache_dtype"):
        DeploymentConfig(kv_cache_dtype="fp4")


@pytest.mark.parametrize("model,tp,expected", [
    ("llama-3.1-8b", 1, 131072 // 16),                                    # plain: the whole length
    ("gpt-oss-120b", 1, 8192 + (-(-(128 - 1 + 8192) // 16) + 1)),          # full + window-and-step (+1)
    ("gemma-3-27b", 1, 8192 + 6 * (-(-(1024 - 1 + 8192) // 16) + 1)),      # 1 full + 6 sliding groups
    ("llama-4-scout", 2, 8192 + 3 * ((8192 + 8192) // 16)),                # 1 full + 3 chunked groups
    ("qwen3-next-80b-a3b", 2, 8192 + 3 * 34),                              # 1 full + 3 state groups
])
def test_vllm_admission_blocks_per_request(model, tp, expected):
    """vLLM's per-request budget (max_memory_usage_bytes per group, summed) at max_model_len 131072 and
    max_num_batched_tokens 8192: what its "Maximum concurrency" line divides the pool by."""
    layout = kv_layout(model, tp, 16)
    assert layout.admission_blocks(131072, 8192) == expected
    assert layout.vllm_max_concurrency(10 * expected, 131072, 8192) == 10.0


def test_short_requests_take_their_whole_length_in_a_sliding_group():
    layout = kv_layout("gpt-oss-20b", 1, 16)
    assert layout.admission_blocks(64, 8192) == 64 // 16 + (64 // 16 + 1)  # full 4 + sliding 4 (+1)
