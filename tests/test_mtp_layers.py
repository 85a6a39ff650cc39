"""vLLM's "mtp" proposer drafts with the target checkpoint's own MTP layers (issue 19)."""
from __future__ import annotations

import json

import pytest

from kernels_cost_model import get_model
from kernels_cost_model.errors import ConfigError
from sim import SimulationConfig


@pytest.mark.parametrize("model, layers", [("deepseek-v3", 1), ("qwen3-next-80b-a3b", 1),
                                           ("qwen3-next-80b-a3b-fp8", 1), ("llama-3.1-8b", 0),
                                           ("gpt-oss-120b", 0)])
def test_catalog_records_the_config_json_mtp_layers(model, layers):
    assert get_model(model).num_mtp_layers == layers


@pytest.mark.parametrize("key", ["num_nextn_predict_layers", "mtp_num_hidden_layers"])
def test_config_json_mtp_keys_are_read(tmp_path, key):
    cfg = {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 512,
           "vocab_size": 1000, key: 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert get_model(str(path)).num_mtp_layers == 2


def test_mtp_on_a_model_without_mtp_layers_names_the_field():
    with pytest.raises(ConfigError) as err:
        SimulationConfig(speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    assert err.value.field == "speculative_config.method"
    assert "llama" in str(err.value).lower()


def test_mtp_on_deepseek_v3_is_accepted():
    config = SimulationConfig().replace(deployment={"model": "deepseek-v3", "gpu": "h200",
                                                    "tensor_parallel_size": 8},
                                        speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    assert config.speculative_config.method == "mtp"
