"""Shortcuts of the engine's and the policies' hot paths: taking the long way changes no record.

- `Engine._apply_rows` skips the prefix-cache registration check for a row whose request is in the
  step planned next (async scheduling, the plain KV manager: that plan registered all the row could);
  making the check for every row (`plan_registers = False`) registers nothing more.
- `Policy.decode_running` inlines the KV manager's growth in place where the budget holds every row;
  with a manager that does not allow it, every row goes through `allocate_or_preempt`.
- The inlined decode paths skip the exact check for a full block to register below `req.kv_register_at`
  tokens; with a manager that does not allow it (`registers_at` False) every row checks, registering
  nothing more, and the bound never passes the true one. The decode pass skips every block check below
  `req.kv_grow_at`, which never passes the token count that takes a block or fills one.
- `Policy.try_admit` skips `can_fit` where allocating the whole sequence asks the same; asking it too
  changes no record.
- A decode row's one token in flight is its placeholder under async scheduling, so the hot paths move one
  counter for it (`Request.num_in_flight_extra`): a request's tokens in flight are still those of the
  steps in flight that schedule it.
- The engine loop moves SimPy's clock on by a step's duration without a timeout where no event is due by
  the step's end (`EngineProcess._pass_time`); yielding a timeout for every step changes no record, with
  aborts, closed-loop clients, a run cut short by `until` and replicas sharing one clock."""
from __future__ import annotations

import sys
from dataclasses import replace
from unittest import mock

import simpy
from hypothesis import given, strategies as st

from tests.engine_harness import engine_configs, for_policy, scripted_specs
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.kv_cache import KVCacheManager
from sim.core.scheduler_profiles import get_scheduler_profile
from sim.engine.engine import Engine
from sim.engine.simulation import EngineProcess, run_engine, start_workload
from tests.test_fast_mode import assert_identical, configs, long_runs
from workloads import poisson_workload


class NoInlineKV(KVCacheManager):
    """The plain manager, but callers may not inline its growth (`grows_in_place` False)."""

    grows_in_place = False


class NoHintKV(KVCacheManager):
    """The plain manager, but callers check every row for a block to register (`registers_at` False)."""

    registers_at = False


class BoundCheckingKV(KVCacheManager):
    """The plain manager checking, at every registration, that no request's `kv_register_at` passes
    the token count at which its next block is full (so no skipped check missed a registration)."""

    def cache_full_blocks(self, req, num_tokens=None) -> None:
        self._check_bounds()
        super().cache_full_blocks(req, num_tokens)

    def take_next_block(self, blocks: list[int], total: int) -> bool:
        self._check_bounds()
        return super().take_next_block(blocks, total)

    def _check_bounds(self) -> None:
        """Neither bound passes the true one; `kv_grow_at` (the decode pass's) neither the block to take."""
        for other, blocks in self.req_blocks.items():
            full = (self.num_hashed_blocks.get(other, 0) + 1) * self.block_size
            assert other.kv_register_at <= full
            assert other.kv_grow_at <= min(full, len(blocks) * self.block_size + 1)

    registers_at = True  # (overriding cache_full_blocks would turn it off)


class CanFitAlwaysKV(KVCacheManager):
    """The plain manager whose `can_fit` the policies may not skip (a subclass's own)."""

    def can_fit(self, req, num_new_tokens, cached_blocks=()) -> bool:
        return super().can_fit(req, num_new_tokens, cached_blocks)


def _run(specs, config, plan_registers: bool = True, kv=None):
    """The run's records (a repr) and the requests whose row `_apply_rows` registered blocks for
    while the request was in the step planned next (it calls only when a block is new)."""
    env = simpy.Environment()
    engine = Engine(config, LinearCostModel(), config.num_gpu_blocks, kv=kv)
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
    config = for_policy(config, policy, async_scheduling=True, enable_prefix_caching=True, mode=mode)
    skipping, _ = _run(specs, config, plan_registers=True)
    checking, late = _run(specs, config, plan_registers=False)
    assert not late
    assert skipping == checking


@given(scripted_specs(), engine_configs(), st.sampled_from(["vllm-v0", "orca", "sarathi", "static"]),
       st.booleans())
def test_decoding_through_allocate_changes_no_record(specs, config, policy, async_scheduling):
    config = for_policy(config, policy, async_scheduling=async_scheduling, mode="step")
    kv = NoInlineKV(config.num_gpu_blocks, config.block_size, config.enable_prefix_caching,
                    get_scheduler_profile(config.scheduler_profile).free_uncached_first)
    assert _run(specs, config) == _run(specs, config, kv=kv)


def _kv(kind, config):
    return kind(config.num_gpu_blocks, config.block_size, config.enable_prefix_caching,
                get_scheduler_profile(config.scheduler_profile).free_uncached_first)


@given(scripted_specs(), engine_configs(), st.sampled_from(["vllm", "vllm-v0", "orca", "sarathi"]), st.booleans(),
       st.sampled_from(["fast", "step"]))
def test_registering_below_the_bound_changes_no_record(specs, config, policy, async_scheduling, mode):
    config = for_policy(config, policy, async_scheduling=async_scheduling, enable_prefix_caching=True,
                        mode=mode)
    hinted = _run(specs, config)
    assert hinted == _run(specs, config, kv=_kv(NoHintKV, config))
    assert hinted == _run(specs, config, kv=_kv(BoundCheckingKV, config))


@given(scripted_specs(), engine_configs(), st.sampled_from(["vllm", "vllm-v0"]), st.booleans())
def test_admitting_without_can_fit_changes_no_record(specs, config, policy, async_scheduling):
    config = for_policy(config, policy, async_scheduling=async_scheduling, mode="step",
                        scheduler_reserve_full_isl=True)
    assert _run(specs, config) == _run(specs, config, kv=_kv(CanFitAlwaysKV, config))


def _in_flight_checked(specs, config) -> int:
    """Run the step engine, checking after every plan and every finish that each request's
    `num_in_flight_tokens` is the sum of its rows' tokens in the steps planned and not finished."""
    env = simpy.Environment()
    engine = Engine(config, LinearCostModel(), config.num_gpu_blocks)
    flying, plan, finish, checks = [], engine.plan_step, engine.finish_step, [0]

    def check():
        rows = {}
        for step in flying:
            for req, n in step.plan.scheduled:
                rows[req] = rows.get(req, 0) + n
        for req in {*rows, *engine.state.running, *engine.state.waiting}:
            assert req.num_in_flight_tokens == rows.get(req, 0), req.request_id
        checks[0] += 1

    def planned(now):
        step = plan(now)
        if step is not None:
            flying.append(step)
        check()
        return step

    def finished(step, now, following=None):
        out = finish(step, now, following)
        flying.remove(step)
        check()
        return out

    engine.plan_step, engine.finish_step = planned, finished
    start_workload(env, specs, EngineProcess(env, engine).submit, seed=0)
    env.run()
    return checks[0]


@given(scripted_specs(), engine_configs(), st.sampled_from(["vllm", "vllm-v0", "sarathi"]), st.booleans())
def test_tokens_in_flight_are_those_of_the_steps_in_flight(specs, config, policy, async_scheduling):
    config = for_policy(config, policy, async_scheduling=async_scheduling, mode="step")
    assert _in_flight_checked(specs, config) > 0


def _timed_every_step(run):
    """`run()` with the engine loop yielding a SimPy timeout for every step (no clock moved directly)."""
    with mock.patch.object(EngineProcess, "_pass_time", lambda self, delay: False):
        return run()


@given(long_runs(), configs(), st.sampled_from(["fast", "step"]), st.floats(0.0, 1.0))
def test_passing_time_without_a_timeout_changes_no_record(specs, config, mode, cut):
    """A whole run, and one cut short by `until` exactly at a step's end (SimPy stops there first)."""
    config = replace(config, mode=mode)
    run = lambda until=None: run_engine(specs, config, LinearCostModel(), until=until)  # noqa: E731
    whole = run()
    assert_identical(_timed_every_step(run), whole)
    ends = [start + duration for start, duration in zip(whole.steps.start_time, whole.steps.duration)
            if duration > 0]
    if ends:
        until = ends[int(cut * (len(ends) - 1))]
        assert_identical(_timed_every_step(lambda: run(until)), run(until))


@given(st.sampled_from(["fast", "step"]), st.booleans(), st.sampled_from([None, 0.5, 2.0]))
def test_passing_time_changes_no_record_beside_clients_and_replicas(mode, async_scheduling, until):
    """Closed-loop clients (each finish schedules an event at its time), `until`, and two replicas whose
    steps interleave on one clock."""
    from sim import SimulationConfig
    from sim.planning.cluster import simulate_cluster
    from workloads import ClosedLoopClients, Independent, ThinkTime, Uniform
    config = EngineConfig(num_gpu_blocks=600, max_model_len=1024, mode=mode, async_scheduling=async_scheduling)
    clients = ClosedLoopClients(4, 30, Independent(Uniform(1, 200), Uniform(1, 120)), think_time=ThinkTime(0.05))
    run = lambda: run_engine(clients, config, LinearCostModel(), until=until)  # noqa: E731
    assert_identical(_timed_every_step(run), run())
    cluster = SimulationConfig(engine=config, workload={"num_requests": 40, "rate": 30.0})
    both = lambda: simulate_cluster(cluster, 2).results.requests.to_csv()  # noqa: E731
    assert _timed_every_step(both) == both()


def test_most_overloaded_steps_pass_time_without_a_timeout():
    """Under overload a step often ends before the next arrival: the loop then makes no timeout."""
    passed = []
    pass_time = EngineProcess._pass_time

    def counted(self, delay):
        passed.append(pass_time(self, delay))
        return passed[-1]

    config = EngineConfig(num_gpu_blocks=3000, max_model_len=4096, mode="step")
    with mock.patch.object(EngineProcess, "_pass_time", counted):
        run_engine(poisson_workload(rate=30.0, num_requests=60, lengths="sharegpt"), config, LinearCostModel())
    assert sum(passed) > len(passed) // 4


def test_an_environment_of_another_kind_gets_a_timeout_for_every_step():
    """A subclass of SimPy's Environment (a real-time one, one that watches its events) is never moved
    on directly: each step yields its timeout, and the run is the same."""
    class Watched(simpy.Environment):
        """Counts the timeouts its processes make."""
        timeouts = 0

        def timeout(self, delay, value=None):
            Watched.timeouts += 1
            return super().timeout(delay, value)

    config = EngineConfig(num_gpu_blocks=3000, max_model_len=4096, mode="step").resolved()
    workload = poisson_workload(rate=30.0, num_requests=30, lengths="sharegpt")
    env = Watched()
    engine = Engine(config, LinearCostModel(), config.num_gpu_blocks)
    process = EngineProcess(env, engine)
    assert not process.passes_time
    start_workload(env, workload, process.submit, 0, process.enqueue)
    env.run()
    records = engine.records(env.now)
    assert Watched.timeouts >= len(records.steps.start_time) > 0
    assert_identical(records, run_engine(workload, config, LinearCostModel()))
