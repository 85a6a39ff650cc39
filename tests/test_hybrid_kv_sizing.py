"""servesim's hybrid KV sizing against the figures vLLM's own functions compute for the catalog models
(tests/data/vllm_hybrid_kv_sizing.json, recorded with benchmarks/vllm_hybrid_kv_sizing_probe.py from vLLM
0.19.1 and 0.33.0): pool block bytes, layer groups, block size, num_gpu_blocks for the same available
memory, the "GPU KV cache size" tokens and the "Maximum concurrency" figure, per release."""
import json
from pathlib import Path

import pytest

from kernels_cost_model.kv_memory import kv_layout
from sim.core.config import EngineConfig
from sim.core.kv_groups import window_budget_tokens

DATA = json.loads((Path(__file__).parent / "data" / "vllm_hybrid_kv_sizing.json").read_text())
PROFILE = {"0.19": "vllm-0.19", "0.33": "vllm-0.33"}


def _rows(modelled: bool):
    for release, rec in DATA["releases"].items():
        for row in rec["rows"]:
            linear = row["model"].startswith("qwen3-next")
            if (row["hybrid_manager"] and not linear) == modelled:
                yield pytest.param(release, row, id=f"{release}-{row['model']}-tp{row['tp']}-{row['max_model_len']}"
                                   f"-{'async' if row['async_scheduling'] else 'sync'}-{'hma' if row['hybrid_manager'] else 'off'}")


@pytest.mark.parametrize("release,row", list(_rows(True)))
def test_hybrid_sizing_matches_vllm(release, row):
    layout = kv_layout(row["model"], row["tp"], 16)
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


def test_the_releases_differ_in_concurrency():
    """0.33 budgets two steps of tokens beyond a window under async scheduling, 0.19 one."""
    a, b = (next(r for r in DATA["releases"][rel]["rows"] if r["model"] == "gpt-oss-120b" and r["tp"] == 1
                 and r["hybrid_manager"] and r["max_model_len"] == 131072) for rel in ("0.19", "0.33"))
    assert a["num_blocks"] == b["num_blocks"] and a["max_concurrency"] > b["max_concurrency"]
