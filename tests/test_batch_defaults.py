"""vLLM's step budget and batch size when unset, by GPU and entry point (vLLM 0.19's
EngineArgs.get_batch_defaults; sim/core/batch_defaults.py)."""
import dataclasses

import pytest
from hypothesis import assume, given, strategies as st

from kernels_cost_model.errors import ConfigError
from kernels_cost_model.hardware import list_gpus
from sim import SimulationConfig
from sim.core.batch_defaults import USAGE_CONTEXTS, batch_defaults, with_batch_defaults
from sim.core.config import EngineConfig

GIB = 2**30


@pytest.mark.parametrize("gpu,context,budget,seqs", [
    ("h100", "openai_api_server", 8192, 1024),       # vllm serve on an H100
    ("h200", "llm_class", 16384, 1024),              # LLM(...) on an H200
    ("rtx-pro-6000", "openai_api_server", 8192, 1024),  # 96 GB
    ("h200", "openai_api_server", 8192, 1024),        # 139.8 GiB: below the 160 GiB tier
    ("a100-sxm-80gb", "openai_api_server", 2048, 256),  # 80 GB, but an A100 (vLLM PR #17885)
    ("a100", "llm_class", 8192, 256),
    ("l40s", "openai_api_server", 2048, 256),         # 48 GB
    ("rtx-4090", "llm_class", 8192, 256),
    ("b200", "openai_api_server", 16384, 1024),       # >= 160 GiB (vLLM 0.33, the default profile)
    ("mi300x", "llm_class", 16384, 1024),
    ("h100", "engine_context", 2048, 128),            # SchedulerConfig's class defaults
    ("l4", "engine_context", 2048, 128),
])
def test_a_simulation_takes_vllms_defaults_for_its_gpu_and_entry_point(gpu, context, budget, seqs):
    config = SimulationConfig(deployment={"gpu": gpu}, engine={"usage_context": context})
    assert (config.engine.max_num_batched_tokens, config.engine.max_num_seqs) == (budget, seqs)


def test_the_device_tiers_are_memory_and_name_as_each_release_has_them():
    assert batch_defaults("openai_api_server", 70 * GIB, "x") == (8192, 1024)
    assert batch_defaults("openai_api_server", 70 * GIB - 1, "x") == (2048, 256)
    assert batch_defaults("openai_api_server", 80 * GIB, "NVIDIA A100-SXM4-80GB") == (2048, 256)
    assert batch_defaults("openai_api_server", 160 * GIB, "x") == (16384, 1024)
    assert batch_defaults("openai_api_server", 160 * GIB, "x", "0.19") == (8192, 1024)  # no such tier
    assert batch_defaults("openai_api_server", 119 * GIB, "gb10", "0.33", "12.1") == (2048, 256)
    assert batch_defaults("openai_api_server", 119 * GIB, "gb10", "0.19", "12.1") == (8192, 1024)


def test_the_release_is_the_scheduler_profiles():
    b200 = SimulationConfig(deployment={"gpu": "b200"})
    assert b200.engine.max_num_batched_tokens == 16384
    older = b200.replace(engine={"scheduler_profile": "vllm-0.19"})
    assert (older.engine.max_num_batched_tokens, older.engine.max_num_seqs) == (8192, 1024)


def test_set_values_are_kept_and_the_unset_one_follows_vllms_rules():
    c = SimulationConfig(engine={"max_num_seqs": 64}, deployment={"gpu": "l40s"})
    assert (c.engine.max_num_batched_tokens, c.engine.max_num_seqs) == (2048, 64)
    c = SimulationConfig(engine={"max_num_batched_tokens": 512})              # H100: 1024 seqs, capped
    assert (c.engine.max_num_batched_tokens, c.engine.max_num_seqs) == (512, 512)
    c = SimulationConfig(engine={"enable_chunked_prefill": False}, deployment={"gpu": "a100"})
    assert c.engine.max_num_batched_tokens == 131072                          # at least max_model_len
    c = SimulationConfig(engine={"max_model_len": 4, "max_num_seqs": 8})
    assert c.engine.max_num_batched_tokens == 32                              # at most seqs x max_model_len


def test_replacing_the_gpu_or_entry_point_derives_them_anew_but_keeps_set_ones():
    base = SimulationConfig()
    a100 = base.replace(deployment={"gpu": "a100"})
    assert (a100.engine.max_num_batched_tokens, a100.engine.max_num_seqs) == (2048, 256)
    back = a100.replace(deployment={"gpu": "h100"})
    assert (back.engine.max_num_batched_tokens, back.engine.max_num_seqs) == (8192, 1024)
    offline = base.replace(engine={"usage_context": "llm_class"})
    assert offline.engine.max_num_batched_tokens == 16384
    pinned = base.replace(engine={"max_num_seqs": 300}).replace(deployment={"gpu": "a100"})
    assert (pinned.engine.max_num_batched_tokens, pinned.engine.max_num_seqs) == (2048, 300)


def test_an_engine_with_no_gpu_keeps_servesims_fixed_defaults():
    e = EngineConfig(max_model_len=4096).resolved()
    assert (e.max_num_batched_tokens, e.max_num_seqs) == (8192, 256)
    assert EngineConfig(max_model_len=4096, enable_chunked_prefill=False).resolved().max_num_batched_tokens == 4096


def test_an_unknown_entry_point_is_a_named_error():
    with pytest.raises(ConfigError, match="usage_context"):
        EngineConfig(usage_context="cli")


@given(st.sampled_from(list_gpus()), st.sampled_from(USAGE_CONTEXTS), st.booleans(),
       st.integers(1, 200_000), st.none() | st.integers(1, 4096), st.none() | st.integers(1, 65536))
def test_defaults_always_give_an_engine_vllm_would_start(gpu, context, chunked, length, seqs, budget):
    """Every running request has a token of the budget, and without chunking a whole prompt fits one step
    (vLLM's SchedulerConfig checks), whenever the user set neither or set them consistently."""
    assume(chunked or budget is None or budget >= length)  # (else a named error, tests/test_validation.py)
    engine = EngineConfig(max_model_len=length, enable_chunked_prefill=chunked, max_num_seqs=seqs,
                          max_num_batched_tokens=budget, usage_context=context)
    from kernels_cost_model.kv_memory import total_memory_bytes
    resolved = with_batch_defaults(engine, *batch_defaults(context, total_memory_bytes(gpu), gpu))
    if seqs is not None:
        assert resolved.max_num_seqs == seqs
    if budget is not None:
        assert resolved.max_num_batched_tokens == budget
        return
    assert resolved.max_num_batched_tokens <= resolved.max_num_seqs * length
    assert chunked or resolved.max_num_batched_tokens >= min(length, resolved.max_num_seqs * length)
    if seqs is None:
        assert resolved.max_num_seqs <= resolved.max_num_batched_tokens
    assert dataclasses.replace(resolved) == resolved


def test_throughput_mode_doubles_the_defaulted_settings_only():
    fast = SimulationConfig(engine={"performance_mode": "throughput"})
    assert (fast.engine.max_num_batched_tokens, fast.engine.max_num_seqs) == (16384, 2048)   # H100 serve x 2
    pinned = SimulationConfig(engine={"performance_mode": "throughput", "max_num_seqs": 100})
    assert (pinned.engine.max_num_batched_tokens, pinned.engine.max_num_seqs) == (16384, 100)
    back = fast.replace(engine={"performance_mode": "balanced"})
    assert (back.engine.max_num_batched_tokens, back.engine.max_num_seqs) == (8192, 1024)
    with pytest.raises(ConfigError, match="performance_mode"):
        EngineConfig(performance_mode="fast")


def test_interactivity_mode_captures_every_batch_size_up_to_32():
    from kernels_cost_model.cuda_graph import capture_sizes
    from sim.api.cost_setup import build_cost_model
    assert capture_sizes(256, interactivity=True)[:33] == (*range(1, 33), 40)
    config = SimulationConfig(engine={"performance_mode": "interactivity"})
    assert 13 in build_cost_model(config.deployment, config.engine).cuda_graph_sizes
    assert 13 not in build_cost_model(config.deployment, SimulationConfig().engine).cuda_graph_sizes
