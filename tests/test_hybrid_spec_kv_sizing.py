"""servesim's KV sizing of a hybrid target with a speculative head against vLLM's own functions
(tests/data/vllm_hybrid_kv_sizing.json `drafter_rows`, recorded with
benchmarks/vllm_hybrid_kv_sizing_probe.py --drafters from vLLM 0.19.1 and 0.33.0): the head's
full-attention layer grouped with the target's layers (gpt-oss + EAGLE-3: groups of 19 and 13 layers),
a state group's 1 + k states per request (Qwen3-Next + MTP), and the layout the manager decision
(sim.core.hybrid_switch.run_layout) gives, every layer full where it is off (Llama-4 + EAGLE)."""
import json
from collections import Counter
from pathlib import Path

import pytest

from kernels_cost_model import get_model
from kernels_cost_model.kv_memory import kv_block_size, kv_cache_memory_bytes, kv_layout, weight_bytes_per_gpu
from kernels_cost_model.model_shapes import CHUNKED, FULL, LINEAR, SLIDING
from kernels_cost_model.speculative import drafter_spec, proposer_kv_cache_blocks
from sim.api.simulator import (SimulationConfig, kv_capacity_meta, resolve_kv_groups, resolve_kv_layout,
                               resolve_num_gpu_blocks)
from sim.core.config import EngineConfig
from sim.core.hybrid_switch import OFFLOADING, run_layout
from sim.core.kv_groups import window_budget_tokens

DATA = json.loads((Path(__file__).parent / "data" / "vllm_hybrid_kv_sizing.json").read_text())
PROFILE = {"0.19": "vllm-0.19", "0.33": "vllm-0.33"}
KIND = {"FullAttentionSpec": FULL, "SlidingWindowSpec": SLIDING, "ChunkedLocalAttentionSpec": CHUNKED,
        "MambaSpec": LINEAR}


def _rows(linear: bool):
    for release, rec in DATA["releases"].items():
        for row in rec["drafter_rows"]:
            if row["model"].startswith("qwen3-next") == linear and "error" not in row:
                yield pytest.param(release, row, id=f"{release}-{row['model']}-{row['speculative_method']}"
                                   f"-k{row['num_speculative_tokens']}-tp{row['tp']}-{row['max_model_len']}"
                                   f"-{'async' if row['async_scheduling'] else 'sync'}"
                                   f"-{'hma' if row['hybrid_manager'] else 'off'}")


def _layout(release, row):
    """The run's layout: the manager decision for the method (a 0.19 connector turning it off for the
    rows recorded with it off, 0.33 all-full likewise), then the head's layers and the states."""
    base = kv_layout(row["model"], row["tp"], kv_block_size(row["model"], row["tp"], 16, release=release))
    method = row["speculative_method"]
    layout = run_layout(base, PROFILE[release], (), method)
    if not row["hybrid_manager"] and layout.is_hybrid:
        layout = run_layout(base, PROFILE[release], (OFFLOADING,), method) if release == "0.19" else base.all_full()
    return (layout.with_drafter_layers(row["drafter_layers"])
            .with_speculative_state(row["num_speculative_tokens"]))


def _engine(release, row):
    return EngineConfig(max_model_len=row["max_model_len"], max_num_batched_tokens=row["max_num_batched_tokens"],
                        scheduler_profile=PROFILE[release], async_scheduling=row["async_scheduling"])


def _layers_per_kind(groups):
    out = Counter()
    for kind, n in groups:
        out[kind] += n
    return out


@pytest.mark.parametrize("release,row", list(_rows(linear=False)))
def test_sizing_with_a_drafter_head_matches_vllm(release, row):
    layout = _layout(release, row)
    blocks = row["available_bytes"] // layout.block_bytes
    vllm_groups = [(KIND[k], n) for k, n in row["groups"]]
    assert Counter(g.kind for g in layout.groups) == Counter(k for k, _ in vllm_groups)
    assert _layers_per_kind((g.kind, g.num_layers) for g in layout.groups) == _layers_per_kind(vllm_groups)
    assert layout.group_size == max(n for _, n in vllm_groups)
    assert blocks == row["num_blocks"]
    assert layout.tokens(blocks) == row["kv_cache_tokens"]
    concurrency = layout.vllm_max_concurrency(blocks, row["max_model_len"], window_budget_tokens(_engine(release, row)))
    assert concurrency == pytest.approx(row["max_concurrency"], abs=1e-6)


@pytest.mark.parametrize("release,row", list(_rows(linear=True)))
def test_a_state_model_with_mtp_holds_one_plus_k_states_as_vllm(release, row):
    """Qwen3-Next + MTP: the MTP layer joins the 12 full-attention layers (groups of 13), and each of
    the three state groups holds 1 + k states per request, at the block size vLLM raises 16 to (544
    tokens: one block a state; docs/models.md): blocks, tokens and concurrency as vLLM's."""
    layout = _layout(release, row)
    vllm_groups = [(KIND[k], n) for k, n in row["groups"]]
    assert Counter(g.kind for g in layout.groups) == Counter(k for k, _ in vllm_groups)
    assert layout.group_size == max(n for _, n in vllm_groups) == 13
    assert layout.block_size == row["block_size"] and layout.page_bytes == row["page_bytes"]
    k = row["num_speculative_tokens"]
    assert [g.state_blocks for g in layout.groups if g.kind == LINEAR] == [1 + k] * 3
    blocks = row["available_bytes"] // layout.block_bytes
    assert blocks == row["num_blocks"]
    assert layout.tokens(blocks) == row["kv_cache_tokens"]
    concurrency = layout.vllm_max_concurrency(blocks, row["max_model_len"], window_budget_tokens(_engine(release, row)))
    assert concurrency == pytest.approx(row["max_concurrency"], abs=1e-6)


def test_the_recorded_rows_cover_each_case():
    rows = DATA["releases"]["0.19"]["drafter_rows"]
    first = {(r["model"], r["hybrid_manager"]): r for r in rows}
    assert first["gpt-oss-120b", True]["groups"] == [["SlidingWindowSpec", 18], ["FullAttentionSpec", 19]]
    assert first["gpt-oss-20b", True]["groups"] == [["SlidingWindowSpec", 12], ["FullAttentionSpec", 13]]
    assert first["llama-4-scout", False]["groups"] == [["FullAttentionSpec", 49]]
    assert "error" in first["qwen3-next-80b-a3b", False]
    assert len(DATA["releases"]["0.33"]["drafter_rows"]) == len(rows)


def _config(model, method, k=3, gpu="h100", tp=1, profile="vllm-0.33", max_model_len=32768):
    return SimulationConfig.from_dict({"deployment": {"model": model, "gpu": gpu, "tensor_parallel_size": tp},
                                       "engine": {"scheduler_profile": profile, "max_model_len": max_model_len},
                                       "speculative_config": {"method": method, "num_speculative_tokens": k}})


def _expected_blocks(config, block_bytes):
    d, e = config.deployment, config.engine.resolved()
    drafter = drafter_spec(config.speculative_config.method, d.model)
    free = kv_cache_memory_bytes(d.model, d.gpu, d.tensor_parallel_size, d.gpu_memory_utilization,
                                 e.max_num_batched_tokens, e.max_num_seqs)
    return (free - weight_bytes_per_gpu(drafter, d.tensor_parallel_size, d.gpu)) // block_bytes


@pytest.mark.parametrize("model,method,gpu,tp,group_size", [
    ("gpt-oss-120b", "eagle3", "h200", 1, 19), ("gpt-oss-20b", "eagle3", "h100", 1, 13),
    ("gemma-3-27b", "eagle", "h200", 1, 11), ("qwen3-next-80b-a3b", "mtp", "h200", 2, 13)])
def test_the_run_sizes_its_pool_in_blocks_of_the_grouped_layout(model, method, gpu, tp, group_size):
    """The memory left after the head's weights, cut into blocks of group_size pages (the head's layer
    grouped in), not the target's all-layers bytes per token."""
    config = _config(model, method, gpu=gpu, tp=tp)
    layout = resolve_kv_layout(config)
    assert layout.is_hybrid and layout.group_size == group_size
    blocks = resolve_num_gpu_blocks(config)
    assert blocks == _expected_blocks(config, layout.block_bytes)
    meta = kv_capacity_meta(config, blocks)
    assert meta["max_concurrency"] == layout.vllm_max_concurrency(blocks, 32768,
                                                                  window_budget_tokens(config.engine.resolved()))
    groups = resolve_kv_groups(config)  # the engine's: states added by the spec hook when it attaches
    assert [g.num_layers for g in groups] == [g.num_layers for g in layout.groups]
    k = config.speculative_config.num_speculative_tokens
    assert [(1 + k) * g.state_blocks for g in groups] == [(1 + k) * g.state_blocks if g.kind == LINEAR else 0
                                                          for g in groups]
    assert [g.state_blocks * ((1 + k) if g.kind == LINEAR else 1) for g in groups] == \
        [g.state_blocks for g in layout.groups]


def test_gpt_oss_with_eagle3_was_sized_as_if_every_layer_were_full_attention_before():
    """The earlier per-token mix (hybrid block count x all-layers bytes) against the grouped layout."""
    config = _config("gpt-oss-120b", "eagle3", gpu="h200")
    layout = resolve_kv_layout(config)
    assert layout.block_bytes == 19 * layout.page_bytes
    d, e = config.deployment, config.engine.resolved()
    old = proposer_kv_cache_blocks(d.model, d.gpu, drafter_spec("eagle3", d.model), 1, 16, d.gpu_memory_utilization,
                                   e.max_num_batched_tokens, max_num_seqs=e.max_num_seqs)
    assert old != resolve_num_gpu_blocks(config)


@pytest.mark.parametrize("profile", ["vllm-0.19", "vllm-0.33"])
def test_llama4_with_eagle_sizes_every_layer_and_the_head_as_one_group(profile):
    """vLLM turns its hybrid manager off (chunked attention with EAGLE): one group of the 48 layers and
    the head, the same run_layout decision the scheduling follows."""
    config = _config("llama-4-scout", "eagle", gpu="h200", tp=2, profile=profile)
    layout = resolve_kv_layout(config)
    assert not layout.is_hybrid and layout.group_size == get_model("llama-4-scout").num_layers + 1
    assert resolve_kv_groups(config) is None
    assert resolve_num_gpu_blocks(config) == _expected_blocks(config, layout.block_bytes)


def test_a_plain_target_is_sized_per_token_as_before():
    config = _config("llama-3.1-8b", "eagle3")
    d, e = config.deployment, config.engine.resolved()
    assert resolve_num_gpu_blocks(config) == proposer_kv_cache_blocks(
        d.model, d.gpu, drafter_spec("eagle3", d.model), 1, 16, d.gpu_memory_utilization, e.max_num_batched_tokens,
        max_num_seqs=e.max_num_seqs)
