"""The plain engine reads and advances a step's rows in one pass (`Engine._rows_advanced`); with a
hook it reads them, lets the hook see them, then advances them (`Engine._rows`, `Engine._advance`).
A hook that does nothing must not change a run: both paths give the same records (the plain path
advances the decode pass's rows untested, `SchedulerOutput.num_decodes`)."""
from __future__ import annotations

from hypothesis import given, strategies as st

from tests.engine_harness import engine_configs, for_policy, scripted_specs
from sim.core.cost import LinearCostModel
from sim.core.hooks import EngineHook
from sim.engine.simulation import run_engine


def _records(specs, config, hooks=()) -> str:
    """The run's step, request and token-time records, as a repr (NaN equals NaN there)."""
    records = run_engine(specs, config, LinearCostModel(), config.num_gpu_blocks, hooks=hooks)
    times = [None if t is None else list(t) for t in records.requests.times()]
    steps = {name: list(column) for name, column in records.steps.columns().items()}
    requests = {name: list(column) for name, column in records.requests.columns().items()}
    return repr((steps, requests, times, records.end_time))


@given(scripted_specs(), engine_configs(), st.booleans(), st.sampled_from(["vllm", "vllm-v0", "orca", "sarathi", "static"]))
def test_a_do_nothing_hook_changes_no_record(specs, config, async_scheduling, policy):
    config = for_policy(config, policy, async_scheduling=async_scheduling, mode="step", check_invariants=False)
    assert _records(specs, config) == _records(specs, config, hooks=[EngineHook()])
