"""CPU KV offload: invariants per tier, content invariance across offload/reload, reload pricing,
hit rates per tier, named errors."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, strategies as st

from kernels_cost_model.errors import ConfigError
from kernels_cost_model.links import Link
from sim.api.simulator import SimulationConfig, simulate
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.scheduler_profiles import get_scheduler_profile
from sim.core.kv_offload import CPUOffloadKVCacheManager, check_cpu_tier
from sim.core.request import Request, RequestStatus
from sim.core.sampling_params import SamplingParams
from sim.engine.engine import Engine
from kernels_cost_model.host_copies import host_copies
from sim.planning.offload import OffloadConfig, OffloadTransfers, simulate_offload, tier_block_bytes
from tests.engine_harness import assert_outputs_match_run_until_stop, drive, engine_configs, scripted_specs
from workloads.spec import RequestSpec


def _offload_engine(config: EngineConfig, num_cpu_blocks: int) -> Engine:
    kv = CPUOffloadKVCacheManager(config.num_gpu_blocks, config.block_size, True, num_cpu_blocks,
                                  get_scheduler_profile(config.scheduler_profile).free_uncached_first)
    transfers = OffloadTransfers(host_copies("pcie5"), 64 * 2**10, check=True)
    return Engine(config, LinearCostModel(), config.num_gpu_blocks, kv=kv, hooks=[transfers])


@given(scripted_specs(), engine_configs(), st.integers(1, 64))
def test_outputs_and_kv_survive_offload_and_reload(specs, config, num_cpu_blocks):
    config = dataclasses.replace(config, enable_prefix_caching=True)
    engine = _offload_engine(config, num_cpu_blocks)
    kv = engine.state.kv
    logs = drive(engine, specs)             # check_invariants (GPU tier) after every step
    check_cpu_tier(kv)
    assert_outputs_match_run_until_stop(engine, specs)
    assert kv.num_free_blocks == kv.num_usable_blocks and not kv.req_blocks
    assert len(kv.cpu) <= num_cpu_blocks
    assert kv.gpu_hit_tokens + kv.cpu_hit_tokens == sum(engine.requests.num_cached_tokens)
    assert logs or not specs


def _prompt(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(100, 30000, n).astype(np.int32)


def _specs():
    """A 512-token prompt, 12 others that push it out of a small GPU cache, then the first again."""
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    first = _prompt(0, 512)
    specs = [RequestSpec(0.0, first, output_len=4, sampling_params=params, request_id="a")]
    specs += [RequestSpec(0.5 + 0.5 * i, _prompt(i + 1, 512), output_len=4, sampling_params=params,
                          request_id=f"x{i}") for i in range(12)]
    specs.append(RequestSpec(20.0, first.copy(), output_len=4, sampling_params=params, request_id="again"))
    return specs


def _config() -> SimulationConfig:
    return SimulationConfig(engine=EngineConfig(num_gpu_blocks=320, max_model_len=2048, check_invariants=True))


def test_an_evicted_prefix_reloads_from_cpu_and_is_priced():
    config = _config()
    plain = simulate(config, workload=_specs()).requests.set_index("request_id")
    out = simulate_offload(config, OffloadConfig(num_cpu_blocks=1000), workload=_specs())
    r = out.requests.set_index("request_id")
    assert plain.loc["again", "num_cached_tokens"] == 0          # evicted from the GPU cache
    assert r.loc["again", "num_cached_tokens"] == 511            # all 32 blocks load; the last token computes
    assert out.summary["cpu_loaded_blocks"] == 32
    # by hand: a Llama-3.1-8B block is 32 layers x K,V x 16 tokens x 8 heads x 128 x 2 bytes = 2 MiB.
    # vLLM 0.33 (the default profile) copies each layer's 64 KiB page apart, batched: the measured batch
    # row at 64 KiB host-to-device took 2.43241596 ms for 2,048 copies; vLLM 0.19 copies each block's
    # 2 MiB (all layers) one by one: 5.21030378 ms for 128
    assert out.summary["cpu_load_s"] == pytest.approx(32 * 32 * 0.00243241596 / 2048, rel=1e-9)
    v019 = simulate_offload(config.replace(engine={"scheduler_profile": "vllm-0.19"}),
                            OffloadConfig(num_cpu_blocks=1000),
                            workload=_specs())
    assert v019.summary["cpu_load_s"] == pytest.approx(32 * 0.00521030378 / 128, rel=1e-9)
    assert r.loc["again", "first_scheduled_time"] == pytest.approx(20.0 + out.summary["cpu_load_s"])
    assert r.loc["again", "ttft_s"] < plain.loc["again", "ttft_s"]  # loading beats recomputing here
    assert out.summary["cpu_prefix_hit_rate"] == pytest.approx(511 / (14 * 512))
    assert out.summary["cpu_offloaded_blocks"] == 13 * 32        # write-through: each distinct block once


def test_the_tier_fills_write_through_and_tops_up_a_gpu_hit():
    """With a GPU cache that evicts nothing, every computed block is still stored; the repeat hits 31
    blocks on the GPU (the last token must compute) and loads the 32nd from the CPU, as vLLM's
    connector looks up full blocks of all the tokens."""
    config = _config().replace(engine={"num_gpu_blocks": 20000})
    out = simulate_offload(config, OffloadConfig(num_cpu_blocks=1000), workload=_specs())
    assert out.summary["cpu_offloaded_blocks"] == 13 * 32
    assert out.requests.set_index("request_id").loc["again", "num_cached_tokens"] == 511
    assert out.summary["cpu_loaded_blocks"] == 1
    assert out.summary["gpu_prefix_hit_rate"] == pytest.approx(496 / (14 * 512))


def test_a_load_waits_beside_the_running_requests():
    """The loading request waits; the others run on undisturbed (a blocking load would stall them)."""
    slow = Link("slow-host", 2e8, 0.0)                          # 2 MiB blocks: 10.5 ms each
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    specs = _specs() + [RequestSpec(19.99, _prompt(99, 64), output_len=40, sampling_params=params,
                                    request_id="busy")]
    specs.sort(key=lambda s: s.arrival_time_s)
    out = simulate_offload(_config(), OffloadConfig(num_cpu_blocks=1000, link=slow), workload=specs)
    r = out.requests.set_index("request_id")
    alone = simulate(_config(), workload=[specs[-2]]).requests.iloc[0]
    assert out.summary["cpu_load_s"] == pytest.approx(32 * 2 * 2**20 / 2e8)
    assert r.loc["busy", "finish_time"] < r.loc["again", "first_scheduled_time"]
    assert r.loc["busy", "tpot_s"] == pytest.approx(alone["tpot_s"])
    waited = r.loc["again", "first_scheduled_time"] - 20.0      # from the step in flight's end, plus the load
    assert out.summary["cpu_load_s"] <= waited <= out.summary["cpu_load_s"] + 2 * r.loc["busy", "tpot_s"]


def test_a_load_parked_by_a_plan_that_schedules_nothing_still_starts():
    """Async scheduling: "again" is parked (its prefix loads from the CPU) by a plan in which the only
    running request's last token is in flight, so nothing is scheduled. vLLM's connector starts the load
    in a step with no forward pass; the run used to crash (`KeyError` in the transfers hook)."""
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    specs = sorted(_specs() + [RequestSpec(19.999, _prompt(99, 64), output_len=2, sampling_params=params,
                                           request_id="busy")], key=lambda s: s.arrival_time_s)
    config = _config().replace(engine={"async_scheduling": True})
    out = simulate_offload(config, OffloadConfig(num_cpu_blocks=1000), workload=specs)
    r = out.requests.set_index("request_id")
    assert r["finish_time"].notna().all() and out.summary["cpu_loaded_blocks"] == 32
    assert r.loc["again", "num_cached_tokens"] == 511
    assert r.loc["again", "first_scheduled_time"] >= 20.0 + out.summary["cpu_load_s"]


def test_stores_become_loadable_when_their_request_lets_go():
    kv = CPUOffloadKVCacheManager(64, 4, True, 16)
    a = Request("a", np.arange(100, 109, dtype=np.int32), SamplingParams(), eos_token_id=0)
    b = Request("b", np.arange(100, 109, dtype=np.int32), SamplingParams(), eos_token_id=0, index=1)
    cached, n = kv.lookup_prefix(a)
    assert kv.allocate(a, 9, cached) is not None
    a.status = RequestStatus.RUNNING
    assert kv.prepare_stores([(a, 9)]) == [(a, 2)]              # two full blocks of 4 tokens
    kv.lookup_prefix(b)
    assert not kv.loads_first(b)                                 # stored, not loadable yet
    a.status = RequestStatus.FINISHED_LENGTH_CAPPED
    free_before = kv.num_free_blocks
    kv.free(a, forget=True)
    assert kv.num_free_blocks == free_before and kv.holds_outside_queues(a)   # held until its stores land
    kv.release(a)
    assert kv.num_free_blocks == kv.num_usable_blocks
    kv.lookup_prefix(b)
    assert kv.loads_first(b) is False                            # the GPU still has them: GPU hits first
    assert all(kv.cpu.values()) and len(kv.cpu) == 2


def test_a_cpu_tier_too_small_for_the_prefix_gives_no_hit():
    out = simulate_offload(_config(), OffloadConfig(num_cpu_blocks=8), workload=_specs())
    assert out.requests.set_index("request_id").loc["again", "num_cached_tokens"] == 0
    assert out.summary["cpu_loaded_blocks"] == 0


def test_reruns_are_bit_identical():
    a = simulate_offload(_config(), OffloadConfig(cpu_bytes=8e9), workload=_specs())
    b = simulate_offload(_config(), OffloadConfig(cpu_bytes=8e9), workload=_specs())
    assert a.requests.equals(b.requests) and a.summary == b.summary


def test_bad_tiers_are_named_errors():
    with pytest.raises(ConfigError, match="offload.cpu_bytes.*smaller than one KV block"):
        simulate_offload(_config(), OffloadConfig(cpu_bytes=1e5), workload=_specs())
    with pytest.raises(ConfigError, match="offload.cpu_bytes"):
        OffloadConfig()
    with pytest.raises(ConfigError, match="offload.link"):
        OffloadConfig(num_cpu_blocks=4, link="floppy")
    with pytest.raises(ConfigError, match="enable_prefix_caching"):
        CPUOffloadKVCacheManager(64, 16, False, 8)


def test_a_cpu_tier_keeps_speculative_decoding():
    from sim.planning.instances import InstanceShape, simulate_instance
    spec = {"method": "eagle3", "num_speculative_tokens": 3}
    config = SimulationConfig().replace(workload={"num_requests": 20}, speculative_config=spec)
    tier = InstanceShape(offload=OffloadConfig(cpu_bytes=10 * 2**30))
    assert simulate_instance(config, tier).summary["mean_tpot_ms"] == simulate(config).summary["mean_tpot_ms"]
    out = simulate_offload(_config().replace(speculative_config=spec), OffloadConfig(num_cpu_blocks=1000),
                           workload=_specs())            # invariants checked every step
    assert out.summary["spec_decode_num_draft_tokens"] > 0
    assert out.requests.set_index("request_id").loc["again", "num_cached_tokens"] == 511


def test_a_request_aborted_while_it_loads_leaves_cleanly():
    specs = _specs()
    specs[-1] = dataclasses.replace(specs[-1], abort_time_s=20.1)   # its 32 blocks take 0.34 s to load
    out = simulate_offload(_config(), OffloadConfig(num_cpu_blocks=1000, link=Link("slow-host", 2e8, 0.0)),
                           workload=specs)                       # invariants checked every step
    again = out.requests.set_index("request_id").loc["again"]
    assert again["finish_reason"] == "abort" and again["num_output_tokens"] == 0
    assert again["finish_time"] == pytest.approx(20.1)
    assert out.summary["cpu_loaded_blocks"] == 32


@st.composite
def _shared_prefix_traffic(draw):
    """Requests over a few shared prefixes (so the tier gets hits), some aborted mid-way."""
    prefixes = [_prompt(100 + i, draw(st.integers(16, 160))) for i in range(draw(st.integers(1, 3)))]
    specs, t = [], 0.0
    for i in range(draw(st.integers(2, 14))):
        t += draw(st.floats(0.0, 0.3))
        prompt = np.concatenate([draw(st.sampled_from(prefixes)), _prompt(i, draw(st.integers(1, 40)))])
        out = draw(st.integers(1, 40))
        abort = t + draw(st.floats(0.0, 0.4)) if draw(st.booleans()) and i % 3 == 0 else None
        specs.append(RequestSpec(t, prompt, output_len=out, abort_time_s=abort, request_id=f"q{i}",
                                 sampling_params=SamplingParams(max_tokens=out, ignore_eos=True)))
    return specs


@given(_shared_prefix_traffic(), st.integers(24, 80), st.integers(1, 200), st.booleans(),
       st.sampled_from([2e8, 5e9, 6.4e10]))
def test_loads_stores_preemptions_and_aborts_keep_every_invariant(specs, gpu_blocks, cpu_blocks, async_on, speed):
    """Invariants after every step (GPU tier conserved, CPU tier within its size, loads consistent), every
    request finished once, and a rerun identical, over small caches that preempt and slow links."""
    config = SimulationConfig(engine=EngineConfig(num_gpu_blocks=gpu_blocks, max_model_len=256, check_invariants=True,
                                                  async_scheduling=async_on, max_num_batched_tokens=256))
    offload = OffloadConfig(num_cpu_blocks=cpu_blocks, link=Link("test-host", speed, 1e-6))
    out = simulate_offload(config, offload, workload=specs)
    again = simulate_offload(config, offload, workload=specs)
    assert out.requests.equals(again.requests) and out.steps.equals(again.steps)
    assert len(out.requests) == len(specs) and out.requests["finish_time"].notna().all()
    wanted = {s.request_id: s.output_len for s in specs}
    for _, r in out.requests.iterrows():
        assert r["finish_reason"] == "abort" or r["num_output_tokens"] == wanted[r["request_id"]]


def test_the_tier_is_sized_as_vllm_sizes_it():
    """vLLM: cpu_bytes // (page bytes x KV tensors x world size). Llama-3.1-8B: 32 layers x K,V x 16 tokens x
    8 heads x 128 x 2 bytes = 2 MiB a block; FP8 KV halves it; at TP 16 each GPU keeps one of the 8 KV
    heads (replicated), so a block takes 16 x 32 x 2 x 16 x 128 x 2 bytes = 4 MiB over all GPUs."""
    gib = OffloadConfig(cpu_bytes=2**30)
    base = SimulationConfig()
    assert gib.cpu_blocks(base) == 512
    assert gib.cpu_blocks(base.replace(deployment={"kv_cache_dtype": "fp8"})) == 1024
    assert tier_block_bytes(base.replace(deployment={"tensor_parallel_size": 16, "gpu": "h200"})) == 4 * 2**20


def test_a_request_whose_hits_load_for_another_is_passed_over():
    """Two requests hit the same CPU blocks: the second waits for the first's load (passed over, first in
    line), while a third behind them is admitted at once; the second then hits the GPU copy (31 blocks:
    the last token computes) and loads its 32nd block from the CPU."""
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    specs = _specs() + [RequestSpec(20.0, _prompt(0, 512), output_len=4, sampling_params=params, request_id="twin"),
                        RequestSpec(20.0, _prompt(77, 64), output_len=4, sampling_params=params, request_id="other")]
    out = simulate_offload(_config(), OffloadConfig(num_cpu_blocks=1000, link=Link("slow-host", 2e8, 0.0)),
                           workload=specs)
    r = out.requests.set_index("request_id")
    landed = r.loc["again", "first_scheduled_time"]
    assert r.loc["other", "first_scheduled_time"] < 20.01 < landed
    assert r.loc["twin", "first_scheduled_time"] >= landed
    assert r.loc["twin", "num_cached_tokens"] == 511 and out.summary["cpu_loaded_blocks"] == 32 + 1  # its 32nd from CPU


OFFLOAD_DIGEST = """
import hashlib, sys, warnings
warnings.simplefilter("ignore")
sys.path[:0] = [sys.argv[1]]
from tests.test_kv_offload import _sessions_digest
print(_sessions_digest())
"""


def _sessions_digest() -> str:
    """sha256 of a tier run's requests and steps (sessions over a small GPU cache: loads, stores, preemptions)."""
    import hashlib
    config = _config().replace(workload={"kind": "sessions", "rate": 2.0, "num_requests": 40, "think_time_s": 5.0},
                               engine={"num_gpu_blocks": 600})
    out = simulate_offload(config, OffloadConfig(num_cpu_blocks=3000))
    assert out.summary["cpu_loaded_blocks"] > 0
    return hashlib.sha256((out.requests.to_csv() + out.steps.to_csv()).encode()).hexdigest()


def test_a_tier_run_is_identical_in_a_fresh_process():
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", OFFLOAD_DIGEST, str(root)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == _sessions_digest()


def test_a_stall_behind_loaded_requests_is_a_named_error():
    """A closed loop on a cache of 200 blocks: a request whose prefix loaded from the CPU tier holds
    146 blocks in the waiting queue behind a preempted head that needs 54 of the 53 free, and nothing
    runs. vLLM's first-come-first-served queue waits there for good; the run says so, naming the
    cache, where it used to end in an InvariantError (a crash)."""
    from tests.fuzz_harness import run_cli
    code, _, err = run_cli("run", "--num-requests", "27", "--workload", "closed_loop", "--num-users", "3",
                           "--lengths", "bwb_translation", "--max-model-len", "auto", "--num-gpu-blocks", "200",
                           "--kv-offloading-size", "10", "--seed", "702", "--no-progress")
    assert code == 2 and "Traceback" not in err
    assert "engine.num_gpu_blocks=200: the KV cache stalled" in err and "hold 146 blocks" in err
