"""KV sizing against vLLM's own start-up logs.

Source: llm-d/llm-d-benchmark, config_explorer/empirical-vllm-memory-results.md (commit 2593348):
vLLM on one H100 80GB (CUDA reports 79.18 GiB), gpu_memory_utilization 0.9, vLLM's H100 defaults
max_num_seqs 1024 and max_num_batched_tokens 8192. "Available KV cache memory" per model below.
"""
import pytest

from kernels_cost_model.kv_memory import GIB, kv_cache_memory_bytes

VLLM_LOG_KV_GIB = [("llama-3.1-8b", 51.38, 0.005), ("qwen3-32b", 4.45, 0.01), ("gpt-oss-20b", 50.28, 0.005)]


@pytest.mark.parametrize("model,logged_gib,tolerance", VLLM_LOG_KV_GIB)
def test_available_kv_memory_matches_vllm_log(model, logged_gib, tolerance):
    ours = kv_cache_memory_bytes(model, "h100", 1, 0.9, max_num_batched_tokens=8192, max_num_seqs=1024) / GIB
    assert ours == pytest.approx(logged_gib, rel=tolerance)


# "Model loading took N GiB": the H100 rows above, and vLLM 0.19 on an A100
# (https://myoceane.fr/index.php/ai-vllm-a100-gemma-4/). MXFP4 experts as vLLM's backend lays them out.
VLLM_LOG_WEIGHT_GIB = [("gpt-oss-20b", "h100", 13.47), ("gpt-oss-120b", "h100", 64.38), ("gpt-oss-20b", "a100", 13.72)]


@pytest.mark.parametrize("model,gpu,logged_gib", VLLM_LOG_WEIGHT_GIB)
def test_mxfp4_weights_match_vllms_model_loading_line(model, gpu, logged_gib):
    from kernels_cost_model.kv_memory import weight_bytes_per_gpu
    assert weight_bytes_per_gpu(model, 1, gpu) / GIB == pytest.approx(logged_gib, rel=0.005)
    assert weight_bytes_per_gpu(model, 1) < 0.96 * logged_gib * GIB      # the checkpoint alone falls short


def test_mxfp4_marlin_layout_matches_vllm_0_10_on_h100():
    """vllm-project/vllm#23278 (vLLM 0.10.1, H100, Marlin backend): "Model loading took 65.9651 GiB";
    #33155 (0.14.1, H100, "Using Triton backend"): 64.38 GiB."""
    from kernels_cost_model.kv_memory import mxfp4_weight_bytes
    from kernels_cost_model.models import get_model
    from kernels_cost_model.mxfp4_layout import MARLIN, TRITON_HOPPER
    oss = get_model("gpt-oss-120b")
    assert mxfp4_weight_bytes(oss, 1, MARLIN) / GIB == pytest.approx(65.9651, rel=0.002)
    assert mxfp4_weight_bytes(oss, 1, TRITON_HOPPER) / GIB == pytest.approx(64.38, rel=0.002)


def test_gpt_oss_120b_matches_the_logs_own_components_not_its_kv_line():
    """The log's gpt-oss-120b row does not add up: 71.26 - 64.38 weights - 7.38 activation - 0.13
    non-torch = -0.63 GiB, yet it prints 3.33 GiB available. servesim reproduces the components."""
    from kernels_cost_model.kv_memory import activation_bytes, non_torch_bytes, weight_bytes_per_gpu
    assert weight_bytes_per_gpu("gpt-oss-120b", 1, "h100") / GIB == pytest.approx(64.38, abs=0.1)
    assert activation_bytes("gpt-oss-120b", 1, 8192, 1024) / GIB == pytest.approx(7.38, abs=0.05)
    assert non_torch_bytes(1) / GIB == pytest.approx(0.13)
    ours = kv_cache_memory_bytes("gpt-oss-120b", "h100", 1, 0.9, max_num_batched_tokens=8192, max_num_seqs=1024)
    assert ours / GIB == pytest.approx(71.26 - 64.38 - 7.38 - 0.13, abs=0.1)


# max_model_len and the step budget, as vLLM derives them

from hypothesis import given, strategies as st  # noqa: E402

from kernels_cost_model.errors import ConfigError  # noqa: E402
from sim import SimulationConfig  # noqa: E402
from sim.cli.main import main  # noqa: E402
from sim.core.config import EngineConfig  # noqa: E402


def test_max_model_len_defaults_to_the_models_maximum():
    assert SimulationConfig().engine.max_model_len == 131072                        # Llama-3.1-8B's own limit
    assert SimulationConfig().replace(deployment={"model": "llama-2-7b"}).engine.max_model_len == 4096
    assert SimulationConfig().replace(deployment={"model": "qwen3-32b"}).engine.max_model_len == 40960
    pinned = SimulationConfig().replace(engine={"max_model_len": 4096}, deployment={"model": "llama-3-8b"})
    assert pinned.engine.max_model_len == 4096                                     # a set one is kept
    linear = SimulationConfig().replace(deployment={"cost_model": "linear"}, engine={"num_gpu_blocks": 900})
    assert linear.engine.max_model_len == 8192                                     # no model in play


def test_max_model_len_above_the_models_maximum_is_an_error_through_the_cli(capsys):
    assert main(["run", "--model", "llama-2-7b", "--max-model-len", "8192"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim: error: engine.max_model_len=8192: exceeds llama-2-7b's maximum context of 4096")


def test_a_kv_cache_smaller_than_one_max_model_len_request_refuses_to_start(capsys):
    # 0.3 x 79.18 GiB leaves ~3.9 GiB of KV (32,000 tokens, with the sampler memory of vLLM's H100 default
    # of 1024 sequences) for Llama-3.1-8B: not one 131072-token request, nor one of 32768
    assert main(["run", "--gpu-memory-utilization", "0.3", "--num-prompts", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim: error: engine.max_model_len=131072: one request of this length needs")
    assert "gpu_memory_utilization=0.3" in err and err.count("\n") == 1
    assert main(["run", "--gpu-memory-utilization", "0.3", "--num-prompts", "5", "--max-model-len", "32768"]) == 2
    capsys.readouterr()
    assert main(["run", "--gpu-memory-utilization", "0.3", "--num-prompts", "5", "--max-model-len", "16384"]) == 0


def test_the_summary_prints_vllms_kv_lines(capsys):
    assert main(["run", "--num-prompts", "5", "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    # 26323 blocks x 16 at vLLM's H100 default of 1024 sequences; vLLM's own log for this model and GPU
    # (the module docstring's) gives 51.38 GiB of KV: 420,904 tokens
    assert "GPU KV cache size: 421,168 tokens" in out
    assert "Maximum concurrency for 32,768 tokens per request: 12.85x" in out


@given(st.integers(1, 200_000), st.booleans())
def test_step_budget_without_chunked_prefill_fits_a_whole_prompt(max_model_len, chunked):
    e = EngineConfig(max_model_len=max_model_len, enable_chunked_prefill=chunked).resolved()  # no GPU
    assert e.max_num_batched_tokens == min(256 * max_model_len, 8192 if chunked else max(max_model_len, 2048))
    assert chunked or e.max_num_batched_tokens >= max_model_len


def test_replacing_the_model_or_chunking_derives_the_defaults_anew():
    base = SimulationConfig()
    small = base.replace(deployment={"model": "llama-2-7b"})        # no stale 131072 carried over
    assert small.engine.max_model_len == 4096
    whole = base.replace(engine={"enable_chunked_prefill": False})
    assert whole.engine.max_num_batched_tokens == 131072               # max(max_model_len, 2048)
    assert whole.replace(engine={"enable_chunked_prefill": True}).engine.max_num_batched_tokens == 8192
    kept = base.replace(engine={"max_model_len": 2048, "max_num_batched_tokens": 4096})
    assert kept.replace(deployment={"gpu": "h200"}).engine.max_model_len == 2048
    with pytest.raises(ConfigError, match="must be >= max_model_len=131072"):
        base.replace(engine={"enable_chunked_prefill": False, "max_num_batched_tokens": 4096})


@pytest.mark.parametrize("max_model_len,starts", [(16000, True), (32000, False)])
def test_qwen3_32b_starts_or_not_as_in_vllms_log(max_model_len, starts):
    """The same log: Qwen3-32B on one H100 started at max-model-len 16000 and failed at 32000."""
    from sim.api.simulator import resolve_num_gpu_blocks
    config = SimulationConfig().replace(deployment={"model": "qwen3-32b"},
                                        engine={"max_model_len": max_model_len, "max_num_seqs": 1024})
    if starts:
        assert resolve_num_gpu_blocks(config) * 16 >= max_model_len
    else:
        with pytest.raises(ConfigError, match="one request of this length needs 32000 KV tokens") as err:
            resolve_num_gpu_blocks(config)
        assert err.value.field == "engine.max_model_len"


def test_cudagraph_memory_comes_out_of_the_kv_cache_and_is_validated():
    from sim.api.simulator import resolve_num_gpu_blocks
    base = resolve_num_gpu_blocks(SimulationConfig())
    assert resolve_num_gpu_blocks(SimulationConfig().replace(deployment={"cudagraph_memory_gib": 1})) == \
        base - 2**30 // (16 * 131072)                                # 1 GiB = 512 blocks of Llama-3.1-8B
    with pytest.raises(ConfigError) as err:
        SimulationConfig().replace(deployment={"cudagraph_memory_gib": -1})
    assert err.value.field == "deployment.cudagraph_memory_gib"


def test_an_engine_without_max_model_len_still_checks_its_other_fields():
    with pytest.raises(ConfigError) as err:
        EngineConfig(scheduling="bogus")
    assert err.value.field == "scheduling"
    assert EngineConfig().resolved().max_model_len == 8192        # an engine run with no model


def test_kv_tokens_of_mistral_small_match_vllms_log():
    """The same document's later revision (commit 4f4d449): Mistral-Small-3.2-24B (text shape of
    mistral-small-24b) on one H100, block size 128: "Available KV cache memory: 28.20 GiB", "GPU KV
    cache size: 184,832 tokens" (1,444 blocks)."""
    from kernels_cost_model.kv_memory import kv_bytes_per_token
    per_block = 128 * kv_bytes_per_token("mistral-small-24b")             # 160 KiB per token
    assert 1444 * per_block / GIB == pytest.approx(28.20, abs=0.005)         # the logged GiB, to its rounding
    assert 184_832 == 1444 * 128


def test_a_hybrid_models_kv_lines_count_per_layer_group(capsys):
    # gpt-oss-120b: 18 full + 18 sliding-window (128) layers share one pool; vLLM reports blocks per
    # group x block size and budgets a sliding group at its window plus its tokens in flight (+1 block):
    # under the default profile (vLLM 0.33, async scheduling) two steps of 8,192 tokens
    assert main(["run", "--model", "gpt-oss-120b", "--gpu", "h200", "--num-prompts", "5"]) == 0
    head = capsys.readouterr().out.splitlines()
    blocks = int(head[0].split(" KV blocks")[0].rsplit(" ", 1)[1])
    assert head[1] == f"GPU KV cache size: {blocks // 2 * 16:,} tokens"
    per_request = 131072 // 16 + (-(-(127 + 2 * 8192) // 16) + 1)    # full group + sliding group
    assert head[2] == f"Maximum concurrency for 131,072 tokens per request: {blocks / per_request:.2f}x"
