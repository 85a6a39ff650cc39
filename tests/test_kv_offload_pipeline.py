"""A CPU KV tier under pipeline parallelism: each stage's GPUs copy only their layers' pages of a block,
over their own links, all stages at once (vLLM runs an offloading worker on every PP rank)."""
from __future__ import annotations

import pytest

from kernels_cost_model.host_copies import host_copies
from kernels_cost_model.links import Link
from sim.planning.instances import InstanceShape, simulate_instance
from sim.planning.offload import OffloadConfig, OffloadTransfers, stage_copies
from sim.planning.pipeline import PipelineConfig
from tests.test_kv_offload import _config, _specs

MIB = 2**20
SLOW = Link("slow-host", 2e8, 1e-5)     # no measured curve: each copy is latency + bytes / bandwidth


def test_each_stage_copies_its_layers_share_of_a_block():
    # Llama-3.1-8B: a block is 2 MiB on one GPU (32 layers x 64 KiB); stages of 20 and 12 layers
    assert stage_copies(2 * MIB, 32, (20, 12), "0.19") == ((1.25 * MIB, 1), (0.75 * MIB, 1))
    assert stage_copies(2 * MIB, 32, (20, 12), "0.33") == ((64 * 2**10, 20), (64 * 2**10, 12))


def test_a_load_lands_with_the_slowest_stage_and_each_stage_queues_on_its_own_link():
    hook = OffloadTransfers(host_copies(SLOW), 0.0, check=False, stages=((1.25 * MIB, 1), (0.75 * MIB, 1)))
    first, seconds = hook._copy(4, "h2d", 1.0)
    stage0, stage1 = 4 * (1e-5 + 1.25 * MIB / 2e8), 4 * (1e-5 + 0.75 * MIB / 2e8)
    assert (first, seconds) == (pytest.approx(1.0 + stage0), pytest.approx(stage0))
    assert hook.h2d_free == [pytest.approx(1.0 + stage0), pytest.approx(1.0 + stage1)]
    second, _ = hook._copy(1, "h2d", 1.0)     # queues behind the first on each stage's link
    assert second == pytest.approx(1.0 + stage0 + (1e-5 + 1.25 * MIB / 2e8))
    assert hook.d2h_free == [0.0, 0.0]        # the other direction's copies are apart


def test_under_pp2_a_reload_takes_the_stages_bytes_over_its_link():
    """By hand: 32 blocks of Llama-3.1-8B reload; under vLLM 0.19 each GPU copies each block's pages of
    its layers in one copy. Stage 0 (20 of 32 layers) moves 1.25 MiB a block: 32 x (10 us + 1.25 MiB /
    200 MB/s) = 0.21004 s; stage 1 (12 layers) 0.126 s at once. The load lands with stage 0's. Without
    PP one GPU moves all 2 MiB a block: 0.33586 s."""
    config = _config().replace(engine={"scheduler_profile": "vllm-0.19"})
    tier = OffloadConfig(num_cpu_blocks=1000, link=SLOW)
    pp2 = simulate_instance(config, InstanceShape(pipeline=PipelineConfig(2, layer_partition=(20, 12)),
                                                  offload=tier), workload=_specs())
    pp1 = simulate_instance(config, InstanceShape(offload=tier), workload=_specs())
    assert pp2.summary["cpu_loaded_blocks"] == pp1.summary["cpu_loaded_blocks"] == 32
    assert pp2.summary["cpu_load_s"] == pytest.approx(32 * (1e-5 + 1.25 * MIB / 2e8), rel=1e-12)
    assert pp2.summary["cpu_load_s"] == pytest.approx(0.2100352, rel=1e-6)
    assert pp1.summary["cpu_load_s"] == pytest.approx(32 * (1e-5 + 2 * MIB / 2e8), rel=1e-12)
    again = pp2.requests.set_index("request_id").loc["again"]
    assert again["num_cached_tokens"] == 511
    assert again["first_scheduled_time"] >= 20.0 + pp2.summary["cpu_load_s"]


def test_stores_are_the_stages_shares_too():
    config = _config().replace(engine={"scheduler_profile": "vllm-0.19"})
    tier = OffloadConfig(num_cpu_blocks=1000, link=SLOW)
    pp2 = simulate_instance(config, InstanceShape(pipeline=PipelineConfig(2), offload=tier), workload=_specs())
    blocks = pp2.summary["cpu_offloaded_blocks"]
    assert pp2.summary["cpu_store_s"] == pytest.approx(blocks * (1e-5 + 1 * MIB / 2e8), rel=1e-9)
