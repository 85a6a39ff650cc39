"""`Engine._apply_rows` skips the prefix-cache registration check for a row whose request is in the
step planned next (async scheduling, the plain KV manager: that plan registered all the row could).
Making the check for every row (`plan_registers = False`) must register nothing more and change no
record."""
from __future__ import annotations

import dataclasses
import sys

import simpy
from hypothesis import given, strategies as st

from tests.engine_harness import engine_configs, scripted_specs
from sim.core.cost import LinearCostModel
from sim.engine.engine import Engine
from sim.engine.simulation import EngineProcess, start_workload


def _run(specs, config, plan_registers: bool):
    """The run's records (a repr) and the requests whose row `_apply_rows` registered blocks for
    while the request was in the step planned next (it calls only when a block is new)."""
    env = simpy.Environment()
    engine = Engine(config, LinearCostModel(), config.num_gpu_blocks)
    engine.plan_registers = plan_registers
    kv, late = engine.state.kv, []
    register = kv.cache_full_blocks

    def watched(req, num_tokens=None):
        if sys._getframe(1).f_code.co_name == "_apply_rows" and req.num_in_flight_tokens:
            late.append(req.request_id)
        register(req, num_tokens)

    kv.cache_full_blocks = watched
    start_workload(env, specs, EngineProcess(env, engine).submit, seed=0)
    env.run()
    records = engine.records(env.now)
    times = [None if t is None else list(t) for t in records.requests.times()]
    steps = {name: list(column) for name, column in records.steps.columns().items()}
    requests = {name: list(column) for name, column in records.requests.columns().items()}
    return repr((steps, requests, times, records.end_time)), late


@given(scripted_specs(), engine_configs(), st.sampled_from(["vllm", "vllm-v0"]), st.sampled_from(["fast", "step"]))
def test_checking_every_row_registers_nothing_more(specs, config, policy, mode):
    config = dataclasses.replace(config, async_scheduling=True, enable_prefix_caching=True, policy=policy,
                                 mode=mode)
    if policy == "vllm-v0":  # whole prompts: the budget holds the longest
        config = dataclasses.replace(config, max_num_batched_tokens=max(config.max_num_batched_tokens,
                                                                        config.max_model_len))
    skipping, _ = _run(specs, config, plan_registers=True)
    checking, late = _run(specs, config, plan_registers=False)
    assert not late
    assert skipping == checking
