"""The engine inside SimPy: arrivals, idling, aborts, bad input, determinism (issue 3)."""
from __future__ import annotations

import contextlib
import gc
import warnings
from unittest import mock

import numpy as np
import pandas as pd
import pytest

from sim import SimulationConfig, simulate
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.hooks import EngineHook
from kernels_cost_model.errors import ConfigError
from sim.core.sampling_params import SamplingParams
from sim.engine.simulation import run_engine
from workloads import ClosedLoopClients, poisson_workload
from workloads.spec import RequestSpec

COST = LinearCostModel(fixed_s=0.01, per_new_token_s=0.0, per_context_token_s=0.0, per_sampled_s=0.0)


def _spec(t, prompt_len=8, out=4, rid=None, abort=None, max_tokens=16):
    return RequestSpec(t, np.arange(prompt_len, dtype=np.int32) + 100, output_len=out, request_id=rid,
                       sampling_params=SamplingParams(max_tokens=max_tokens), abort_time_s=abort)


def test_engine_idles_between_arrivals_and_steps_only_with_work():
    cfg = EngineConfig(num_gpu_blocks=64, max_model_len=64, async_scheduling=False)
    rec = run_engine([_spec(0.0), _spec(10.0)], cfg, COST)
    # (async scheduling, vLLM's default, adds one wasted decode step after each EOS: 10 steps)
    assert len(run_engine([_spec(0.0), _spec(10.0)], EngineConfig(num_gpu_blocks=64, max_model_len=64),
                          COST).steps.start_time) == 10
    starts = rec.steps.start_time
    # 1 prefill step + 3 decodes per request, 10 ms each, nothing in between
    assert len(starts) == 8
    assert starts[:4] == pytest.approx([0.0, 0.01, 0.02, 0.03])
    assert starts[4:] == pytest.approx([10.0, 10.01, 10.02, 10.03])
    assert rec.end_time == pytest.approx(10.04)


def test_abort_finishes_request_and_frees_kv_at_once():
    cfg = EngineConfig(num_gpu_blocks=64, max_model_len=64, check_invariants=True)
    rec = run_engine([_spec(0.0, out=None, rid="long", abort=0.055), _spec(0.0, rid="short")], cfg, COST)
    i = rec.requests.request_id.index("long")
    assert rec.requests.finish_reason[i] == "abort"
    assert rec.requests.finish_time[i] == pytest.approx(0.06)  # at the end of the step in flight
    assert 0 < rec.requests.num_output_tokens[i] < 16
    assert rec.steps.kv_blocks_used[-1] == 0


def test_abort_of_waiting_request_never_schedules_it():
    cfg = EngineConfig(num_gpu_blocks=64, max_model_len=64, max_num_seqs=1)
    rec = run_engine([_spec(0.0, rid="a", out=10), _spec(0.0, rid="b", abort=0.03)], cfg, COST)
    i = rec.requests.request_id.index("b")
    assert rec.requests.finish_reason[i] == "abort"
    assert np.isnan(rec.requests.first_scheduled_time[i])
    assert rec.requests.finish_time[i] == pytest.approx(0.03)


def test_prompt_longer_than_max_model_len_is_rejected_not_simulated():
    cfg = EngineConfig(num_gpu_blocks=64, max_model_len=64)
    rec = run_engine([_spec(0.0, prompt_len=65, rid="big"), _spec(0.0, rid="ok")], cfg, COST)
    assert rec.requests.rejected == [True, False]
    assert rec.requests.finish_reason == ["length", "length"] or rec.requests.finish_reason[0] == "length"
    assert rec.requests.num_output_tokens[0] == 0


def test_kv_cache_too_small_for_one_request_is_a_clear_error():
    with pytest.raises(ConfigError, match="num_gpu_blocks=3.*max_model_len=64"):
        EngineConfig(num_gpu_blocks=3, block_size=16, max_model_len=64)
    with pytest.raises(ConfigError, match="num_gpu_blocks"):
        run_engine([_spec(0.0)], EngineConfig(max_model_len=64), COST, num_gpu_blocks=2)


@pytest.mark.parametrize("policy", ["vllm", "vllm-v0", "static"])
def test_a_request_that_outgrows_the_usable_blocks_is_a_clear_error(policy):
    """vLLM's size check counts the null block, so a cache of 6 blocks of 16 passes for max_model_len 96
    while only 5 hold tokens: a request grown past 80 tokens would preempt itself and never run again
    (or, with chunked prefill, be readmitted for ever). The run names the cache instead."""
    cfg = EngineConfig(num_gpu_blocks=6, block_size=16, max_model_len=96, policy=policy,
                       max_num_batched_tokens=96)
    spec = RequestSpec(0.0, np.full(70, 7, dtype=np.int32), sampling_params=SamplingParams(max_tokens=20,
                                                                                           ignore_eos=True))
    with pytest.raises(ConfigError, match=r"num_gpu_blocks=6: request 'req-0' needs 6 blocks of 16 tokens for 81 tokens.* 5 usable"):
        run_engine([spec], cfg, COST)


def test_a_prefill_that_outgrows_the_usable_blocks_is_a_clear_error_not_a_livelock():
    """Chunked 16 tokens a step into 2 blocks of 32 (one usable), a 48-token prompt preempts itself at
    its second block and, readmitted from scratch, would do so for ever (bounded here by `until`)."""
    cfg = EngineConfig(num_gpu_blocks=2, block_size=32, max_model_len=64, max_num_batched_tokens=16,
                       long_prefill_token_threshold=1, scheduler_reserve_full_isl=False)
    spec = RequestSpec(0.0, np.full(48, 7, dtype=np.int32), sampling_params=SamplingParams(max_tokens=1))
    with pytest.raises(ConfigError, match=r"num_gpu_blocks=2: request 'req-0' needs 2 blocks of 32 tokens"):
        run_engine([spec], cfg, COST, until=1000.0)


@pytest.mark.parametrize("field,value", [("max_num_seqs", 0), ("block_size", -1), ("block_size", 2**63),
                                         ("scheduling", "lifo"),
                                         ("long_prefill_token_threshold", -5), ("policy", "nope")])
def test_out_of_range_settings_are_named(field, value):
    with pytest.raises(ConfigError, match=field):
        cfg = EngineConfig(**{field: value, "num_gpu_blocks": 1024})
        run_engine([_spec(0.0)], cfg, COST)


def test_unsorted_arrivals_are_a_clear_error():
    cfg = EngineConfig(num_gpu_blocks=64, max_model_len=64)
    with pytest.raises(ValueError, match="sorted"):
        run_engine([_spec(1.0, rid="late"), _spec(0.5, rid="early")], cfg, COST)


def test_closed_loop_clients_drive_the_real_engine():
    cfg = EngineConfig(num_gpu_blocks=2048, max_model_len=4096)
    workload = ClosedLoopClients(num_users=3, num_requests=12, lengths="sharegpt", think_time=0.5)
    rec = run_engine(workload, cfg, LinearCostModel(), seed=1)
    df = pd.DataFrame(rec.requests.columns())
    assert len(df) == 12 and df["finish_reason"].notna().all()
    events = sorted([(t, 1) for t in df["arrival_time"]] + [(t, -1) for t in df["finish_time"]])
    in_flight = np.cumsum([d for _, d in events])
    assert in_flight.max() <= 3


def test_same_config_and_seed_give_identical_results():
    config = SimulationConfig.from_dict({
        "engine": {"num_gpu_blocks": 3000, "max_num_batched_tokens": 1024, "max_model_len": 8192},
        "workload": {"rate": 8.0, "num_requests": 150}, "seed": 7})
    a, b = simulate(config), simulate(config)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert a.summary == pytest.approx(b.summary, nan_ok=True)
    c = simulate(config.replace(seed=8))
    assert not a.requests["arrival_time"].equals(c.requests["arrival_time"])


def test_prefix_caching_hits_on_shared_system_prompt():
    base = {"engine": {"num_gpu_blocks": 4000}, "deployment": {"cost_model": "linear"},
            "workload": {"rate": 4.0, "num_requests": 60, "shared_prefix_len": 512}}
    on = simulate(SimulationConfig.from_dict(base))
    off = simulate(SimulationConfig.from_dict({**base, "engine": {"num_gpu_blocks": 4000,
                                                                 "enable_prefix_caching": False}}))
    assert on.summary["prefix_cache_hit_rate"] > 0.05
    assert off.summary["prefix_cache_hit_rate"] == 0
    assert on.summary["mean_ttft_ms"] < off.summary["mean_ttft_ms"]


def test_priority_scheduling_admits_the_most_important_waiting_request_first():
    cfg = EngineConfig(num_gpu_blocks=64, max_model_len=64, max_num_seqs=1, scheduling="priority")
    specs = [RequestSpec(0.0, np.arange(8, dtype=np.int32), output_len=3, request_id=rid, priority=p)
             for rid, p in (("first", 5), ("low", 9), ("high", 0), ("mid", 5))]
    rec = run_engine(specs, cfg, COST)
    order = sorted(rec.requests.request_id, key=lambda r: rec.requests.first_scheduled_time[
        rec.requests.request_id.index(r)])
    assert order == ["high", "first", "mid", "low"]  # all four wait when the first step is planned


def test_fcfs_ignores_priority():
    cfg = EngineConfig(num_gpu_blocks=64, max_model_len=64, max_num_seqs=1)
    specs = [RequestSpec(0.0, np.arange(8, dtype=np.int32), output_len=3, request_id=rid, priority=p)
             for rid, p in (("a", 5), ("b", 9), ("c", 0))]
    rec = run_engine(specs, cfg, COST)
    times = rec.requests.first_scheduled_time
    assert times[0] < times[1] < times[2]


def _admission_run(reserve_full_isl: bool):
    """A 96-token-prompt request arrives while another holds most of a 10-block cache."""
    cfg = EngineConfig(num_gpu_blocks=10, block_size=16, max_model_len=160, max_num_batched_tokens=32,
                       scheduler_reserve_full_isl=reserve_full_isl, check_invariants=True)
    late = RequestSpec(0.05, np.arange(96, dtype=np.int32) + 5000, output_len=3, request_id="late")
    specs = [_spec(0.0, prompt_len=64, out=60, rid="holder", max_tokens=60), late]  # no shared prefix
    return run_engine(specs, cfg, COST)


def test_reserve_full_isl_admits_only_when_the_whole_prompt_fits():
    """vLLM's default: the first chunk would fit, the whole prompt would not, so it waits."""
    strict, loose = _admission_run(True), _admission_run(False)
    i = strict.requests.request_id.index("late")
    assert strict.requests.first_scheduled_time[i] > loose.requests.first_scheduled_time[i]
    assert strict.requests.num_preemptions[i] == 0
    assert sum(loose.requests.num_preemptions) > 0   # admitting on the first chunk thrashes


def test_simulate_uses_a_given_cost_model_and_refuses_it_for_data_parallel():
    from sim.api.sections import DeploymentConfig
    specs = [RequestSpec(0.1 * i, np.arange(64, dtype=np.int32) + 100, output_len=8, request_id=f"r{i}")
             for i in range(4)]
    base = simulate(SimulationConfig(seed=0), workload=specs)
    slow = LinearCostModel(fixed_s=0.5)   # half a second a step: far slower than any GPU
    given = simulate(SimulationConfig(seed=0), workload=specs, cost_model=slow)
    assert given.requests["e2e_s"].min() > 8 * 0.5 > base.requests["e2e_s"].max()
    dp = SimulationConfig(deployment=DeploymentConfig(model="qwen3-30b-a3b", gpu="h100", data_parallel_size=2,
                                                      enable_expert_parallel=True))
    with pytest.raises(ConfigError, match="cost_model"):
        simulate(dp, workload=specs, cost_model=slow)


class _CollectorProbe(EngineHook):
    """Records whether Python's cyclic garbage collector was on at each step's end."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, engine, now: float) -> None:
        self.seen.append(gc.isenabled())


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_during_a_run_and_restored_after(enabled):
    probe = _CollectorProbe()
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        run_engine([_spec(0.0), _spec(0.5)], EngineConfig(num_gpu_blocks=64, max_model_len=64), COST,
                   hooks=[probe])
        assert probe.seen and not any(probe.seen)
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_the_collector_is_restored_when_a_run_fails():
    assert gc.isenabled()
    with pytest.raises(ValueError, match="sorted"):
        run_engine([_spec(1.0), _spec(0.0)], EngineConfig(num_gpu_blocks=64, max_model_len=64), COST)
    assert gc.isenabled()


def test_a_paused_collector_gives_the_same_records():
    """Only speed may depend on the collector: a run with it on throughout gives the same records."""
    workload = poisson_workload(rate=20.0, num_requests=60, lengths="conversation")
    cfg = EngineConfig(num_gpu_blocks=400, max_model_len=4096, max_num_seqs=16)
    paused = run_engine(workload, cfg, COST, seed=3)
    with mock.patch("sim.engine.simulation.collector_paused", contextlib.nullcontext):
        running = run_engine(workload, cfg, COST, seed=3)
    assert paused.steps.columns() == running.steps.columns()
    assert paused.requests.columns() == running.requests.columns()


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_open_loop_arrivals_make_no_done_events(mode):
    """Open-loop arrivals hand requests over with `EngineProcess.enqueue` (nothing waits on them, so
    no event for their end): the same records as arrivals through `submit`, whose events a caller
    that waits still gets; an abort timer and a rejected request go through either way."""
    import simpy
    from sim.engine.engine import Engine
    from sim.engine.simulation import EngineProcess, run_env, start_workload

    specs = [_spec(0.0, out=30, rid="a"), _spec(0.01, rid="b", abort=0.05, out=50), _spec(0.02, rid="c"),
             _spec(0.03, prompt_len=5000, rid="too-long")]

    class CountingEnvironment(simpy.Environment):
        scheduled = 0

        def schedule(self, event, priority=1, delay=0):
            # (timeouts not counted: a step passes its time without one where no event is due first,
            # and a done event waiting in the queue is one)
            self.scheduled += not isinstance(event, simpy.events.Timeout)
            super().schedule(event, priority, delay)

    scheduled = []

    def run(through_enqueue: bool):
        env = CountingEnvironment()
        config = EngineConfig(num_gpu_blocks=64, max_model_len=256, mode=mode)
        proc = EngineProcess(env, Engine(config, COST, 64))
        start_workload(env, specs, proc.submit, 0, proc.enqueue if through_enqueue else None)
        waited = proc.submit(_spec(0.0, rid="waited"))
        run_env(env)
        assert waited.triggered and waited.value.request_id == "waited"
        assert not proc.done_events
        scheduled.append(env.scheduled)
        return proc.engine.records(env.now)

    events, no_events = run(False), run(True)
    assert scheduled[0] - scheduled[1] == len(specs)  # one done event each, rejected request included
    assert repr(no_events.requests.columns()) == repr(events.requests.columns())
    assert repr(no_events.steps.columns()) == repr(events.steps.columns())
    columns = no_events.requests.columns()
    reasons = dict(zip(columns["request_id"], columns["finish_reason"]))
    assert reasons["b"] == "abort" and reasons["a"] == "length"
    assert [rid for rid, rejected in zip(columns["request_id"], no_events.requests.rejected) if rejected] == \
        ["too-long"]


@pytest.mark.parametrize("until", [float("nan"), "5", True, 0, -1.0])
def test_simulate_names_a_bad_until_before_the_run(until):
    with pytest.raises(ConfigError) as err:
        simulate(SimulationConfig().replace(workload={"num_requests": 5}), until=until)
    assert err.value.field == "until" and err.value.value is until


@pytest.mark.parametrize("kwargs, field", [
    (dict(config={"max_num_seqs": 4}), "config"), (dict(cost_model="h100"), "cost_model"),
    (dict(num_gpu_blocks="100"), "engine.num_gpu_blocks"), (dict(num_gpu_blocks=10**12), "engine.num_gpu_blocks"),
    (dict(workload=5), "workload"), (dict(workload=[{"arrival_time_s": 0}]), "workload[0]"),
    (dict(workload=None), "workload"), (dict(progress=5), "progress"),
])
def test_run_engine_names_a_bad_argument_before_the_run(kwargs, field):
    args = {"workload": [_spec(0.0)], "config": EngineConfig(num_gpu_blocks=64, max_model_len=64),
            "cost_model": COST, **kwargs}
    with pytest.raises(ConfigError) as err:
        run_engine(args.pop("workload"), args.pop("config"), args.pop("cost_model"), **args)
    assert err.value.field == field


def test_a_length_finish_is_a_cut_only_short_of_max_tokens():
    """An output that ends at max_model_len on the token its max_tokens allows is complete, not cut;
    one that ends there short of its max_tokens (or with none) is, and the warning says so."""
    from sim.api.results import Results
    from sim.api.validation import length_cuts, warn_length_cuts
    cfg = EngineConfig(num_gpu_blocks=64, max_model_len=64)
    specs = [_spec(0.0, prompt_len=60, out=40, rid="exact", max_tokens=4),
             _spec(0.1, prompt_len=60, out=40, rid="none", max_tokens=None),
             _spec(0.2, prompt_len=50, out=40, rid="fits", max_tokens=4)]
    requests = Results.from_records(run_engine(specs, cfg, COST)).requests.set_index("request_id")
    assert list(requests["max_tokens"].fillna(-1)) == [4, -1, 4]
    assert list(requests["finish_reason"]) == ["length"] * 3
    assert list(requests["num_output_tokens"]) == [4, 4, 4]
    assert list(length_cuts(requests, 64)) == [False, True, False]
    with pytest.warns(UserWarning, match="1 of 3 requests .* cut at engine.max_model_len=64"):
        warn_length_cuts(requests, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_length_cuts(requests.drop(index="none"), 64)
