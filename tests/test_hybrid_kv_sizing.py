"""servesim's hybrid KV sizing against the figures vLLM's own functions compute for the catalog models
(tests/data/vllm_hybrid_kv_sizing.json, recorded with benchmarks/vllm_hybrid_kv_sizing_probe.py from vLLM
0.19.1 and 0.33.0): pool block bytes, layer groups, block size, num_gpu_blocks for the same available
memory, the "GPU KV cache size" tokens and the "Maximum concurrency" figure, per release; with vLLM's
hybrid manager on, and off (every layer as full attention; a linear-state model refused), as
sim.core.hybrid_switch decides it."""
import json
from pathlib import Path

import pytest

from kernels_cost_model.errors import ConfigError
from kernels_cost_model.kv_memory import kv_block_size, kv_layout
from kernels_cost_model.model_shapes import FULL, LINEAR
from sim.core.hybrid_switch import NIXL, OFFLOADING, run_layout
from sim.core.config import EngineConfig
from sim.core.kv_groups import window_budget_tokens

DATA = json.loads((Path(__file__).parent / "data" / "vllm_hybrid_kv_sizing.json").read_text())
PROFILE = {"0.19": "vllm-0.19", "0.33": "vllm-0.33"}


def _rows(hybrid_manager: bool = True, linear: bool | None = None):
    """Rows recorded with the manager on (or off), of linear-state models (Qwen3-Next), of the others, or
    (None) of all. The probe records mamba_cache_mode "none" in both releases: 0.33 turns prefix caching
    on by default and then uses "align" mode, which servesim does not model (docs/models.md)."""
    for release, rec in DATA["releases"].items():
        for row in rec["rows"]:
            if row["hybrid_manager"] == hybrid_manager and linear in (None, row["model"].startswith("qwen3-next")):
                yield pytest.param(release, row, id=f"{release}-{row['model']}-tp{row['tp']}-{row['max_model_len']}"
                                   f"-{'async' if row['async_scheduling'] else 'sync'}-{'hma' if row['hybrid_manager'] else 'off'}")


@pytest.mark.parametrize("release,row", list(_rows()))
def test_hybrid_sizing_matches_vllm(release, row):
    """Every row with the manager on, Qwen3-Next's at the block size vLLM raises 16 to (544 tokens), one
    state block per request and group."""
    block_size = kv_block_size(row["model"], row["tp"], 16, release=release)
    layout = kv_layout(row["model"], row["tp"], block_size)
    engine = EngineConfig(max_model_len=row["max_model_len"], max_num_batched_tokens=row["max_num_batched_tokens"],
                          scheduler_profile=PROFILE[release], async_scheduling=row["async_scheduling"])
    blocks = row["available_bytes"] // layout.block_bytes
    assert layout.block_size == row["block_size"]
    assert layout.page_bytes == row["page_bytes"]
    assert len(layout.groups) == len(row["groups"])
    assert layout.group_size == max(n for _, n in row["groups"])
    assert blocks == row["num_blocks"]
    assert layout.tokens(blocks) == row["kv_cache_tokens"]
    concurrency = layout.vllm_max_concurrency(blocks, row["max_model_len"], window_budget_tokens(engine))
    assert concurrency == pytest.approx(row["max_concurrency"], abs=1e-6)
    if row.get("mamba_page_bytes"):
        assert all(g.state_blocks == 1 for g in layout.groups if g.kind == LINEAR)
        assert layout.page_bytes >= row["mamba_page_bytes"] > layout.page_bytes - 16 * layout.page_bytes // block_size


def test_the_releases_differ_in_concurrency():
    """0.33 budgets two steps of tokens beyond a window under async scheduling, 0.19 one."""
    a, b = (next(r for r in DATA["releases"][rel]["rows"] if r["model"] == "gpt-oss-120b" and r["tp"] == 1
                 and r["hybrid_manager"] and r["max_model_len"] == 131072) for rel in ("0.19", "0.33"))
    assert a["num_blocks"] == b["num_blocks"] and a["max_concurrency"] > b["max_concurrency"]


@pytest.mark.parametrize("release,row", list(_rows(hybrid_manager=False, linear=False)))
def test_sizing_with_the_hybrid_manager_off_matches_vllm(release, row):
    """A connector vLLM 0.19 turns the manager off for: one full-attention group of every layer."""
    base = kv_layout(row["model"], row["tp"], 16)  # (0.33 keeps the manager with its OffloadingConnector)
    layout = run_layout(base, PROFILE[release], (OFFLOADING,)) if release == "0.19" else base.all_full()
    engine = EngineConfig(max_model_len=row["max_model_len"], max_num_batched_tokens=row["max_num_batched_tokens"],
                          scheduler_profile=PROFILE[release], async_scheduling=row["async_scheduling"])
    blocks = row["available_bytes"] // layout.block_bytes
    assert [(g.kind, g.num_layers) for g in layout.groups] == [(FULL, n) for _, n in row["groups"]]
    assert blocks == row["num_blocks"]
    assert layout.tokens(blocks) == row["kv_cache_tokens"]
    concurrency = layout.vllm_max_concurrency(blocks, row["max_model_len"], window_budget_tokens(engine))
    assert concurrency == pytest.approx(row["max_concurrency"], abs=1e-6)


@pytest.mark.parametrize("release,row", list(_rows(hybrid_manager=False, linear=True)))
def test_a_linear_state_model_with_the_manager_off_is_refused_as_vllm_refuses(release, row):
    assert "unified type" in row["error"]
    with pytest.raises(ConfigError) as err:
        kv_layout(row["model"], row["tp"], 16).all_full()
    assert "linear-attention" in err.value.reason and "refuses to start" in err.value.reason
    if release == "0.19":  # a connector turns it off there
        with pytest.raises(ConfigError) as err:
            run_layout(kv_layout(row["model"], row["tp"], 16), PROFILE[release], (NIXL,))
        assert err.value.field == "engine.scheduler_profile" and err.value.value == "vllm-0.19"


@pytest.mark.parametrize("model", ["gpt-oss-120b", "gemma-3-27b", "llama-4-scout", "qwen3-next-80b-a3b"])
def test_the_rule_per_release(model):
    """0.19 turns the manager off for any connector, 0.33 keeps it with NIXL and the OffloadingConnector;
    both turn it off for chunked local attention with EAGLE-style drafts."""
    layout = kv_layout(model, 1, 16)
    chunked = model.startswith("llama-4")
    for connectors in ((NIXL,), (OFFLOADING,), (NIXL, OFFLOADING)):
        assert run_layout(layout, "vllm-0.33", connectors) is layout
        if model.startswith("qwen3-next"):
            with pytest.raises(ConfigError, match="refuses to start"):
                run_layout(layout, "vllm-0.19", connectors)
        else:
            assert not run_layout(layout, "vllm-0.19", connectors).is_hybrid
    for release in PROFILE.values():
        assert run_layout(layout, release) is layout
        assert run_layout(layout, release, speculative_method="ngram") is layout
        assert (run_layout(layout, release, speculative_method="eagle3") is layout) != chunked


@pytest.mark.parametrize("tp", [1, 2])
def test_the_block_size_vllm_raises_to_per_release(tp):
    """vLLM raises a block size too small for one state page, even one the user set (0.19.1
    models/config.py HybridAttentionMambaModelConfig; 0.33.0 platforms/interface.py
    _align_hybrid_block_size): 0.19 to a multiple of the kernel's 16 tokens, 0.33 to a multiple of the
    size asked for (at least 16), then of 16. A larger size is kept; a model without state is left alone."""
    for asked, old, new in ((1, 544, 544), (16, 544, 544), (32, 544, 544), (64, 544, 576), (544, 544, 544),
                            (1024, 1024, 1024)):
        assert kv_block_size("qwen3-next-80b-a3b", tp, asked, release="0.19") == old
        assert kv_block_size("qwen3-next-80b-a3b", tp, asked, release="0.33") == new
    for model in ("gpt-oss-120b", "gemma-3-27b", "llama-3.1-8b"):
        assert kv_block_size(model, tp, 16, release="0.33") == 16


def test_a_run_of_a_linear_state_model_takes_the_raised_block_size():
    """SimulationConfig resolves the engine at vLLM's block size and the summary header says it was
    raised; replacing the model derives it anew from the size asked for."""
    from sim.api.simulator import SimulationConfig, kv_capacity_meta
    config = SimulationConfig(deployment={"model": "qwen3-next-80b-a3b", "gpu": "h200", "tensor_parallel_size": 2})
    assert config.engine.block_size == 544 and config.given_block_size == 16
    assert kv_capacity_meta(config, 1000)["block_size_asked"] == 16
    assert config.replace(workload={"rate": 2.0}).engine.block_size == 544
    llama = config.replace(deployment={"model": "llama-3.1-8b", "tensor_parallel_size": 1})
    assert llama.engine.block_size == 16 and "block_size_asked" not in kv_capacity_meta(llama, 1000)
    assert config.replace(engine={"block_size": 64}).engine.block_size == 576  # (vllm-0.33)
    assert config.replace(engine={"block_size": 64, "scheduler_profile": "vllm-0.19"}).engine.block_size == 544
