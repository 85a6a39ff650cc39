"""An engine that spins for good (every running request preempted, the head readmitted into the same
wall while waiting requests hold the blocks it needs) ends with a named error, not a run that never
returns; one that an event from outside would rescue runs on (sim.engine.livelock)."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import simpy

from kernels_cost_model.errors import ConfigError
from sim import SimulationConfig
from sim.core.sampling_params import SamplingParams
from sim.engine.livelock import RECURRENCES, WINDOW, SpinWatch, only_own_events
from sim.planning.disagg import simulate_disaggregated
from sim.planning.disagg_config import DisaggConfig, PoolConfig
from sim.planning.offload import OffloadConfig, simulate_offload
from workloads.spec import RequestSpec

WORKLOADS = json.loads((Path(__file__).parent / "data" / "livelock_workloads.json").read_text())


def specs(name: str, **changes) -> list[RequestSpec]:
    """A recorded fuzz workload (sim found spinning by a fuzzing campaign); `changes` by request id."""
    out = []
    for row in WORKLOADS[name]:
        params = {k: tuple(v) if isinstance(v, list) else v for k, v in row["sampling_params"].items()}
        ids = row["output_token_ids"]
        spec = RequestSpec(row["arrival_time_s"], np.asarray(row["prompt_token_ids"], np.int32),
                           output_len=row["output_len"], output_token_ids=tuple(ids) if ids else None,
                           sampling_params=SamplingParams(**params), request_id=row["request_id"],
                           priority=row.get("priority", 0))
        out.append(dataclasses.replace(spec, **changes.get(row["request_id"], {})))
    return out


def cpu_tier_run(profile: str, mode: str, workload):
    """A draft model (5 tokens, 5 lookahead slots), a 34-block cache of 4-token blocks, one-token chunks
    and a CPU tier that loads prefixes."""
    config = SimulationConfig(
        engine={"block_size": 4, "num_gpu_blocks": 34, "max_model_len": 128, "max_num_seqs": 6,
                "max_num_batched_tokens": 8, "long_prefill_token_threshold": 1, "enable_prefix_caching": True,
                "scheduler_reserve_full_isl": False, "scheduler_profile": profile, "stop_profile": "vllm-v1-2025",
                "usage_context": "openai_api_server", "eos_token_id": 2, "mode": mode},
        deployment={"cost_model": "roofline", "model": "llama-3.1-8b", "gpu": "h100"},
        speculative_config={"method": "draft_model", "model": "qwen2.5-0.5b", "num_speculative_tokens": 5,
                            "acceptance_rates": [0.0, 0.58]})
    return simulate_offload(config, OffloadConfig(num_cpu_blocks=20, link="pcie4"), workload=workload)


def disagg_run(pp: int, profile: str, mode: str):
    """A decode pool of one seat under PP while transferred requests hold most of its cache."""
    config = SimulationConfig(
        engine={"block_size": 32, "num_gpu_blocks": 26, "max_model_len": 256, "max_num_seqs": 8,
                "max_num_batched_tokens": 490, "long_prefill_token_threshold": 50, "enable_prefix_caching": False,
                "scheduler_reserve_full_isl": False, "scheduler_profile": profile, "usage_context": "llm_class",
                "eos_token_id": 2, "mode": mode},
        deployment={"cost_model": "linear", "model": "qwen2.5-0.5b"})
    disagg = DisaggConfig(PoolConfig(1), PoolConfig(1, pipeline_parallel_size=pp, engine={"max_num_seqs": 1}),
                          link="ib-ndr", abort_in_transfer="cancel")
    return simulate_disaggregated(config, disagg, workload=specs("disagg_decode_pp3"))


def pp_pools_run(engine: dict, prefill_pp: int, decode_pp: int, workload: str):
    """One prefill and one decode instance, each under PP, the first token sampled on the prefill side."""
    config = SimulationConfig(
        engine={"scheduler_reserve_full_isl": False, "async_scheduling": False, "usage_context": "llm_class",
                "eos_token_id": 2, **engine},
        deployment={"cost_model": "linear", "model": "qwen2.5-0.5b"})
    disagg = DisaggConfig(PoolConfig(1, pipeline_parallel_size=prefill_pp),
                          PoolConfig(1, pipeline_parallel_size=decode_pp), link="nvlink4", first_token="prefill")
    return simulate_disaggregated(config, disagg, workload=specs(workload))


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_cpu_tier_spin_is_named(mode):
    with pytest.raises(ConfigError, match=r"^engine.num_gpu_blocks=34: the engine livelocked.*head r20.*r17: 16.*"
                                          r"vLLM's scheduler spins"):
        cpu_tier_run("vllm-0.33", mode, specs("cpu_tier_draft_model"))


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_a_pending_abort_is_waited_for(mode):
    """The holder's client disconnects at 15 s: the engine spins until then (nothing is named while an event
    from outside is scheduled), and the abort frees the blocks the head needs."""
    results = cpu_tier_run("vllm-0.33", mode, specs("cpu_tier_draft_model", r17={"abort_time_s": 15.0}))
    reqs = results.requests.set_index("request_id")
    assert reqs.loc["r17", "finish_reason"] == "abort"
    assert reqs.loc["r17", "finish_time"] == pytest.approx(15.0)
    assert reqs.loc["r20", "finish_time"] > 15.0 and reqs.loc["r20", "num_preemptions"] > 100
    assert reqs.drop(index="r17")["finish_reason"].isin(["stop", "length"]).all()


def test_other_release_does_not_spin():
    results = cpu_tier_run("vllm-0.19", "fast", specs("cpu_tier_draft_model"))   # (0.19: a slot per seat)
    assert len(results.requests) == 6


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_disaggregated_decode_pool_spin_is_named(mode):
    with pytest.raises(ConfigError, match=r"^disaggregation.decode.num_gpu_blocks=26: the engine livelocked.*head r5.*"
                                          r"3 request\(s\) not running hold 23 blocks.*vLLM's scheduler spins"):
        disagg_run(3, "vllm-0.19", mode)


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_prefill_requests_taking_turns_under_pp_are_named(mode):
    """A prefill instance under PP 4 plans without its requests in flight: at the wall the visible request
    preempts itself, the other lands and does the same; the preempt-only plans alternate victims (a cycle of
    two), and the error says the spin is servesim's plan, not vLLM's."""
    with pytest.raises(ConfigError, match=r"^disaggregation.prefill.num_gpu_blocks=9: the engine livelocked.*"
                                          r"without its requests in flight"):
        pp_pools_run({"block_size": 16, "max_model_len": 128, "num_gpu_blocks": 9, "max_num_seqs": 7,
                      "max_num_batched_tokens": 180, "long_prefill_token_threshold": 3, "enable_prefix_caching": True,
                      "scheduler_profile": "vllm-0.19", "mode": mode}, 4, 2, "disagg_prefill_pp4_turns")


def test_disaggregated_decode_pool_with_two_stages_finishes():
    assert len(disagg_run(2, "vllm-0.19", "fast").requests) == 4


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_two_instances_spinning_at_once_are_named(mode):
    """The prefill instance (PP 2) and the decode instance (PP 4, one seat) both spin, each one's steps queued
    beside the other's: neither can change the other's cycle (no request goes in or out of either)."""
    with pytest.raises(ConfigError,
                       match=r"^disaggregation.(prefill|decode).num_gpu_blocks=258: the engine livelocked"):
        pp_pools_run({"block_size": 1, "max_model_len": 256, "num_gpu_blocks": 258, "max_num_seqs": 1,
                      "max_num_batched_tokens": 33, "long_prefill_token_threshold": 0, "enable_prefix_caching": False,
                      "scheduler_profile": "vllm-0.33", "mode": mode}, 2, 4, "disagg_two_engines")


def test_only_own_events():
    env = simpy.Environment()

    def stepping():
        while True:
            yield env.timeout(1.0)

    def at_once():
        yield env.timeout(0.0)

    own = env.process(stepping())
    env.process(at_once())   # ends at once: its end event resumes nobody
    env.run(until=0.5)
    assert only_own_events(env, {own})
    env.timeout(3.0).callbacks.append(lambda event: None)   # someone else's event
    assert not only_own_events(env, {own})


class FakeKV:
    def __init__(self, free):
        self.free_queue, self.num_cached_hashes = list(free), 0

    num_free_blocks = property(lambda self: len(self.free_queue))
    blocks_of = staticmethod(lambda req: [])


class FakeEngine:
    def __init__(self, free):
        self.state = type("State", (), {"kv": FakeKV(free), "waiting": [], "running": []})()
        self.requests, self.by_id = [], {}


def test_spin_watch_counts_recent_states_then_needs_an_exact_repeat():
    """A request state must have been seen RECURRENCES times among recent preempt-only plans (here two states
    taking turns); then a full state (the free queue's order) must repeat one seen before."""
    watch, orders = SpinWatch(), [[1, 2], [2, 1]]
    turns = [FakeEngine([1, 2]), FakeEngine([1, 2, 3])]   # two request states (a free count of 2 or 3)
    seen = [watch.recurred(turns[i % 2]) for i in range(2 * RECURRENCES)]
    assert seen == [False] * (2 * RECURRENCES - 2) + [True, True]
    assert not watch.repeats_exactly(FakeEngine(orders[0]))
    assert not watch.repeats_exactly(FakeEngine(orders[1]))
    assert watch.repeats_exactly(FakeEngine(orders[0]))
    assert not watch.repeats_exactly(FakeEngine(orders[0]), extra=(("r1",),))   # other batches in flight
    assert not watch.recurred(FakeEngine([4, 5, 6, 7]))   # a state not seen before


def test_spin_watch_forgets_old_states():
    watch = SpinWatch()
    for _ in range(RECURRENCES - 1):
        watch.recurred(FakeEngine([1]))
    for free in range(2, WINDOW + 2):   # WINDOW other states push the first out
        watch.recurred(FakeEngine(list(range(free))))
    assert not watch.recurred(FakeEngine([1]))
