"""max_model_len = -1 / "auto": the model's maximum, or the longest one request the sized KV cache holds
(vLLM's `--max-model-len auto`, vllm/v1/core/kv_cache_utils.py `_auto_fit_max_model_len`)."""
import pickle

import pytest
from hypothesis import given, settings, strategies as st

from kernels_cost_model.errors import ConfigError
from sim import SimulationConfig
from sim.api.simulator import longest_fitting_len, resolve_num_gpu_blocks
from sim.cli.main import main
from sim.core.config import EngineConfig

AUTO = {"max_model_len": -1}


def test_a_model_too_long_for_the_cache_is_fitted_to_it():
    config = SimulationConfig(deployment={"model": "qwen3-32b"}, engine=AUTO)   # one H100: 40,960 do not fit
    assert config.auto_max_model_len and config.engine.max_model_len == 18272
    assert resolve_num_gpu_blocks(config) * 16 == 18272                          # exactly one request's KV
    with pytest.raises(ConfigError, match="the longest that fits is 18272"):
        resolve_num_gpu_blocks(SimulationConfig(deployment={"model": "qwen3-32b"}))


def test_a_model_that_fits_keeps_its_maximum_and_a_new_gpu_fits_anew():
    assert SimulationConfig(engine=AUTO).engine.max_model_len == 131072          # Llama-3.1-8B on an H100
    small = SimulationConfig(deployment={"model": "qwen3-32b"}, engine=AUTO)
    bigger = small.replace(deployment={"gpu": "h200"})
    assert bigger.auto_max_model_len and bigger.engine.max_model_len == 40960
    assert bigger.replace(deployment={"gpu": "h100"}).engine.max_model_len == 18272
    assert pickle.loads(pickle.dumps(small)).auto_max_model_len                   # (parallel sweeps)
    pinned = small.replace(engine={"max_model_len": 8192})
    assert not pinned.auto_max_model_len and pinned.engine.max_model_len == 8192


def test_auto_needs_a_model_and_gpu_and_no_pipeline_stages(capsys):
    with pytest.raises(ConfigError, match="max_model_len=-1: auto"):
        EngineConfig(max_model_len=-1).resolved()
    assert main(["run", "--model", "qwen3-32b", "--max-model-len", "auto", "--num-prompts", "3"]) == 0
    assert "Maximum concurrency for 18,272 tokens per request: 1.00x" in capsys.readouterr().out
    assert main(["run", "--model", "llama-3.1-70b", "-tp", "4", "-pp", "2", "--max-model-len", "-1"]) == 2
    assert "engine.max_model_len=-1: auto is fitted" in capsys.readouterr().err


def test_a_pinned_cache_is_fitted_too():
    config = SimulationConfig(engine={"max_model_len": -1, "num_gpu_blocks": 100})
    assert config.engine.max_model_len == 1600


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["llama-3.1-8b", "qwen3-32b", "llama-3.1-70b", "gpt-oss-20b", "qwen2.5-7b"]),
       st.sampled_from(["h100", "a100", "l40s", "h200"]), st.sampled_from([1, 2, 4]),
       st.floats(0.5, 0.95))
def test_the_fit_is_the_longest_length_the_cache_holds(model, gpu, tp, utilization):
    try:
        config = SimulationConfig(deployment={"model": model, "gpu": gpu, "tensor_parallel_size": tp,
                                              "gpu_memory_utilization": utilization}, engine=AUTO)
    except ConfigError:
        return  # does not fit the GPUs at all, or a TP the model's heads do not allow: a named error
    length = config.engine.max_model_len
    resolve_num_gpu_blocks(config)                                       # one request of it fits
    longer = config.replace(engine={"max_model_len": length + 1}) if length < SimulationConfig(
        deployment={"model": model}).engine.max_model_len else None
    if longer is not None:
        with pytest.raises(ConfigError, match="one request of this length needs"):
            resolve_num_gpu_blocks(longer)
    assert longest_fitting_len(config) == length
