"""Priority scheduling always makes progress (issue 20, difference 1).

A running request that must preempt itself for a block used to leave the step empty: `plan_step`
returned None and the engine slept until the next arrival, or never finished. Under every scheduler
profile, on random priority workloads, every request finishes and the engine never idles while a
request is running or waiting.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine_harness import engine_configs, make_engine, scripted_specs
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.sampling_params import SamplingParams
from sim.core.scheduler_profiles import PROFILES
from sim.engine.simulation import run_engine
from workloads.spec import RequestSpec


def drive_never_idle(engine, specs, max_steps: int = 50_000) -> None:
    pending, now, steps = sorted(specs, key=lambda s: s.arrival_time_s), 0.0, 0
    while pending or engine.has_work:
        while pending and pending[0].arrival_time_s <= now:
            engine.add_request(pending.pop(0), now)
        step = engine.plan_step(now) if engine.has_work else None
        if step is None:
            assert not engine.state.running and not engine.state.waiting, \
                "the engine idles while requests wait to run"
            now = pending[0].arrival_time_s
            continue
        now += step.duration
        engine.finish_step(step, now)
        steps += 1
        assert steps < max_steps, "runaway simulation"


@given(scripted_specs(), engine_configs(), st.sampled_from(sorted(PROFILES)), st.booleans(),
       st.lists(st.integers(0, 5), min_size=8, max_size=8))
def test_priority_workloads_finish_and_never_idle(specs, config, profile, async_scheduling, priorities):
    usable = -(-config.max_model_len // config.block_size) + 1  # one max_model_len request + null block
    config = dataclasses.replace(config, scheduling="priority", scheduler_profile=profile,
                                 async_scheduling=async_scheduling,
                                 num_gpu_blocks=max(config.num_gpu_blocks, usable))
    specs = [dataclasses.replace(s, priority=p) for s, p in zip(specs, priorities)]
    engine = make_engine(config)
    drive_never_idle(engine, specs)
    assert all(reason is not None for reason in engine.requests.finish_reason)
    assert not engine.by_id


def test_issue_reproducer_finishes():
    """The issue's case: a 31-token request at priority 5 must preempt itself for two more important
    requests that arrive during its first step; all three finish."""
    config = EngineConfig(block_size=16, num_gpu_blocks=6, max_model_len=96, enable_prefix_caching=False,
                          scheduling="priority", check_invariants=True)
    tokens = np.arange(100, 131)
    specs = [RequestSpec(0.0, tokens, sampling_params=SamplingParams(max_tokens=40, ignore_eos=True),
                         priority=5, request_id="low"),
             RequestSpec(0.0001, tokens[:30].tolist() + [7, 8], sampling_params=SamplingParams(max_tokens=8),
                         priority=0, request_id="high"),
             RequestSpec(0.0001, tokens[:30].tolist() + [9, 9], sampling_params=SamplingParams(max_tokens=8),
                         priority=1, request_id="mid")]
    for profile in PROFILES:
        records = run_engine(specs, dataclasses.replace(config, scheduler_profile=profile), LinearCostModel())
        assert sorted(records.requests.finish_reason) == ["length", "length", "length"]
