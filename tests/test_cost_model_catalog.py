"""GPU and model catalogs: required entries, aliases, sources, config.json reading, clear errors."""
import json

import pytest

from kernels_cost_model import get_gpu, get_model, list_gpus, list_models
from kernels_cost_model.hardware import _catalog as gpu_catalog
from kernels_cost_model.models import _catalog as model_catalog
from kernels_cost_model.errors import ConfigError

REQUIRED_GPUS = ["a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "h100-sxm", "h100-pcie",
                 "h200", "l40s", "l4", "a10g", "rtx-4090", "rtx-pro-6000", "mi300x"]
REQUIRED_MODELS = ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b",
                   "llama-3.1-70b", "mistral-7b", "qwen2.5-7b", "qwen2.5-32b", "qwen2.5-72b", "qwen3-32b",
                   "mixtral-8x7b", "qwen3-30b-a3b"]


def test_required_gpus_present_with_sources_and_dense_figures():
    assert set(REQUIRED_GPUS) <= set(list_gpus())
    for name in list_gpus():
        gpu = get_gpu(name)
        assert gpu.source
        # the memory's kind, as its source names it (sets the derived default of norms and activations)
        assert gpu.memory_family in ("hbm", "gddr") and gpu.memory_type[:4] in gpu.source
        # dense figures: below 1.4 PFLOP/s bf16 before Blackwell, 2.5 PFLOP/s for the B200/GB300 class
        assert gpu.bf16_flops_per_s < (2.6e15 if gpu.architecture == "blackwell" else 1.4e15)
        if gpu.fp8_flops_per_s is not None:
            assert gpu.fp8_flops_per_s == pytest.approx(2 * gpu.bf16_flops_per_s, rel=0.02)


@pytest.mark.parametrize("alias,canonical", [("h100", "h100-sxm"), ("H100 SXM", "h100-sxm"), ("A100", "a100-sxm-80gb"),
                                             ("a100_40gb", "a100-sxm-40gb"), ("RTX 4090", "rtx-4090"),
                                             ("MI300X", "mi300x")])
def test_gpu_aliases(alias, canonical):
    assert get_gpu(alias).name == canonical


def test_h100_figures():
    gpu = get_gpu("h100")
    assert (gpu.bf16_flops_per_s, gpu.hbm_bytes_per_s, gpu.memory_bytes) == (989.4e12, 3.35e12, 80 * 2**30)


def test_required_models_present_with_sources():
    assert set(REQUIRED_MODELS) <= set(list_models())
    assert all(get_model(m).source.startswith("https://huggingface.co/") for m in list_models())


@pytest.mark.parametrize("name,params_b", [("llama-2-7b", 6.74), ("llama-3.1-8b", 8.03), ("llama-3-70b", 70.55),
                                           ("mixtral-8x7b", 46.7), ("qwen3-30b-a3b", 30.5), ("qwen2.5-72b", 72.7)])
def test_parameter_counts_match_published_sizes(name, params_b):
    assert get_model(name).num_params() / 1e9 == pytest.approx(params_b, rel=0.01)


@pytest.mark.parametrize("alias", ["meta-llama/Llama-3.1-8B-Instruct", "LLAMA-3.1-8B", "llama3.1-8b"])
def test_model_aliases(alias):
    assert get_model(alias).name == "llama-3.1-8b"


def test_unknown_names_are_config_errors_naming_field_and_value():
    with pytest.raises(ConfigError) as gpu_err:
        get_gpu("tpu-v9")
    assert gpu_err.value.field == "gpu" and gpu_err.value.value == "tpu-v9"
    with pytest.raises(ConfigError) as model_err:
        get_model("gpt-17")
    assert model_err.value.field == "model" and "gpt-17" in str(model_err.value)


def test_config_json_gqa_and_moe(tmp_path):
    dense = {"hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
             "intermediate_size": 5632, "vocab_size": 32000, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(dense))
    spec = get_model(tmp_path / "config.json")
    assert (spec.num_kv_heads, spec.head_dim, spec.is_moe) == (4, 128, False)
    assert get_model(str(tmp_path)).hidden_size == 2048  # a folder holding config.json works too
    moe = dict(dense, num_local_experts=8, num_experts_per_tok=2)
    (tmp_path / "moe.json").write_text(json.dumps(moe))
    spec = get_model(str(tmp_path / "moe.json"))
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size) == (8, 2, 5632)


def test_malformed_config_json(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        get_model(tmp_path / "bad.json")
    (tmp_path / "short.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ConfigError, match="lacks required key"):
        get_model(tmp_path / "short.json")


def test_catalog_aliases_do_not_collide():
    for catalog in (gpu_catalog, model_catalog):
        rows, index = catalog()
        assert set(index.values()) == set(rows)
