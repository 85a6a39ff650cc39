"""Lazy rows (sim.engine.lazy_rows): steps of decodes under vLLM V0 that touch only the rows due at their plan
or end give the reference step-by-step engine's records bit for bit (issue 15), and the lazy keeping itself
holds what it promises: aggregates priced as the rows are, rows brought up to date whenever read."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sim.engine.lazy_rows as lazy_rows
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.builder import make_cost_model
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.sampling_params import SamplingParams
from sim.engine.engine import Engine
from sim.engine.lazy_rows import LazyRows, decode_pricer, lazy_rows_for
from sim.engine.simulation import run_engine
from tests.test_fast_mode import EOS, assert_identical, configs, long_runs
from workloads import poisson_workload
from workloads.spec import RequestSpec

ROOFLINE = make_cost_model("llama-2-7b", "a100-sxm-80gb")


class Counting:
    """Counts lazy steps planned and the due rows looked at, over one run (`run`)."""

    def __init__(self, patch):
        self.steps = self.rows = self.due = 0
        plan, due = LazyRows.plan_decodes, LazyRows._due_at_plan

        def plan_decodes(lazy, now):
            step = plan(lazy, now)
            self.steps += 1
            self.rows += len(step.rows)
            return step

        def counted_due(lazy, number, take=True):
            rows = due(lazy, number, take)
            self.due += len(rows) if take else 0
            return rows
        patch.setattr(LazyRows, "plan_decodes", plan_decodes)
        patch.setattr(LazyRows, "_due_at_plan", counted_due)


def run_both(specs, config, cost_model=None, min_rows: int = 1, **kwargs):
    """(step mode's records, fast mode's with lazy rows from `min_rows` running requests, the counts)."""
    cost_model = cost_model or LinearCostModel()
    step = run_engine(specs, replace(config, mode="step"), cost_model, **kwargs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lazy_rows, "MIN_ROWS", min_rows)
        counts = Counting(patch)
        fast = run_engine(specs, replace(config, mode="fast"), cost_model, **kwargs)
    return step, fast, counts


@st.composite
def v0_configs(draw, max_model_len: int = 256):
    """`configs` under vLLM V0's policy (the one lazy rows serve), KV down to one request's worth."""
    return replace(draw(configs(max_model_len)), policy="vllm-v0", enable_chunked_prefill=False,
                   max_num_batched_tokens=draw(st.integers(max_model_len, 800)))


@given(long_runs(max_requests=12), v0_configs())
def test_lazy_rows_give_the_reference_records_bit_for_bit(specs, config):
    step, fast, _ = run_both(specs, config)
    assert_identical(step, fast)


@st.composite
def crowded_v0(draw):
    """A KV cache of one to two requests' worth with prefix caching: preemptions in lazy steps."""
    config = draw(v0_configs(max_model_len=128))
    blocks = -(-128 // config.block_size) + 1
    return replace(config, enable_prefix_caching=True, num_gpu_blocks=draw(st.integers(blocks, 2 * blocks)))


@given(long_runs(max_requests=12), crowded_v0())
def test_lazy_rows_identical_when_preempting(specs, config):
    step, fast, _ = run_both(specs, config)
    assert_identical(step, fast)


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=300))
def test_a_decode_step_is_priced_from_its_aggregates_as_from_its_rows(contexts):
    n = len(contexts)
    for model in (ROOFLINE, LinearCostModel()):
        price = decode_pricer(model)
        assert price(n, sum(contexts), max(contexts)) == model.step_time(BatchShape([1] * n, contexts, n))


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("num_gpu_blocks,rate", [(3_000, 30.0), (6_000, 20.0)])
def test_lazy_rows_identical_on_busy_runs_and_touch_few_rows(async_scheduling, num_gpu_blocks, rate):
    """Busy runs at the default threshold (big batches, preemptions): the same records, and the lazy steps
    look at a fraction of their rows (a block to take or register, a stop test)."""
    config = EngineConfig(num_gpu_blocks=num_gpu_blocks, max_model_len=4096, max_num_batched_tokens=4096,
                          policy="vllm-v0", async_scheduling=async_scheduling, eos_token_id=EOS)
    workload = poisson_workload(rate=rate, num_requests=300, lengths="sharegpt")
    step, fast, counts = run_both(workload, config, ROOFLINE, min_rows=lazy_rows.MIN_ROWS)
    assert_identical(step, fast)
    assert counts.steps > 100
    assert counts.due < 0.4 * sum(step.steps.num_decode_tokens)  # (rows of single lazy steps and jumps)
    assert sum(step.requests.num_preemptions) > 0


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_run_cut_short_brings_its_lazy_rows_up_to_date(async_scheduling):
    """`until` ends the run with lazy rows running and a lazy step in flight: the records read them up to
    date (`Engine.records` settles the rows)."""
    specs = [RequestSpec(0.01 * i, np.arange(30, dtype=np.int32) + 7 * i, output_len=300,
                         sampling_params=SamplingParams(max_tokens=None), request_id=f"r{i}") for i in range(8)]
    config = EngineConfig(num_gpu_blocks=400, max_model_len=1024, policy="vllm-v0", enable_prefix_caching=True,
                          async_scheduling=async_scheduling, eos_token_id=EOS)
    step, fast, counts = run_both(specs, config, until=0.9)
    assert_identical(step, fast)
    assert counts.steps > 0


def test_aborts_of_lazy_rows_match_the_reference():
    specs = [RequestSpec(0.005 * i, np.arange(24, dtype=np.int32) + 3 * i, output_len=200,
                         sampling_params=SamplingParams(max_tokens=None), request_id=f"r{i}",
                         abort_time_s=0.3 + 0.05 * i if i % 3 == 0 else None) for i in range(12)]
    config = EngineConfig(num_gpu_blocks=300, max_model_len=512, policy="vllm-v0", async_scheduling=True,
                          enable_prefix_caching=True, eos_token_id=EOS)
    step, fast, counts = run_both(specs, config)
    assert_identical(step, fast)
    assert counts.steps > 0
    assert list(step.requests.finish_reason).count("abort") >= 2


def test_small_batches_stay_eager_at_the_default_threshold_without_async_scheduling():
    """Without async scheduling quiet steps are leapt over; lazy rows start at `MIN_ROWS` rows."""
    specs = [RequestSpec(0.01 * i, np.arange(20, dtype=np.int32) + i, output_len=60, request_id=f"r{i}")
             for i in range(4)]
    config = EngineConfig(num_gpu_blocks=200, max_model_len=512, policy="vllm-v0", eos_token_id=EOS,
                          async_scheduling=False)
    step, fast, counts = run_both(specs, config, min_rows=lazy_rows.MIN_ROWS)
    assert_identical(step, fast)
    assert counts.steps == 0


def test_quiet_turns_of_small_batches_jump_under_async_scheduling(monkeypatch):
    """Under async scheduling rows are lazy from one row on, and quiet turns of the loop run back to back
    (sim.engine.lazy_jump) instead of leaps: the same records, most steps taken in jumps."""
    import sim.engine.simulation as simulation
    turns = []
    original = simulation.jump

    def counting_jump(lazy, step, env):
        before = lazy.planned
        result = original(lazy, step, env)
        turns.append(lazy.planned - before)
        return result
    monkeypatch.setattr(simulation, "jump", counting_jump)
    specs = [RequestSpec(0.05 * i, np.arange(20, dtype=np.int32) + 11 * i, output_len=120 + 7 * i,
                         sampling_params=SamplingParams(max_tokens=None), request_id=f"r{i}") for i in range(10)]
    config = EngineConfig(num_gpu_blocks=300, max_model_len=512, policy="vllm-v0", eos_token_id=EOS,
                          async_scheduling=True, enable_prefix_caching=True)
    step = run_engine(specs, replace(config, mode="step"), ROOFLINE)
    fast = run_engine(specs, replace(config, mode="fast"), ROOFLINE)
    assert_identical(step, fast)
    assert sum(turns) > 0.5 * len(step.steps)
    assert max(turns) > 20


@pytest.mark.parametrize("change", [
    {"mode": "step"}, {"policy": "vllm"}, {"check_invariants": True}, {"stop_string_detection": "frontend"}])
def test_lazy_rows_only_where_they_apply(change):
    config = EngineConfig(**{"num_gpu_blocks": 100, "max_model_len": 512, "policy": "vllm-v0", "mode": "fast",
                             **change})
    assert lazy_rows_for(Engine(config, LinearCostModel(), 100)) is None


def test_lazy_rows_apply_to_the_plain_v0_engine_and_its_cost_models():
    config = EngineConfig(num_gpu_blocks=100, max_model_len=512, policy="vllm-v0", mode="fast")
    assert lazy_rows_for(Engine(config, LinearCostModel(), 100)) is not None
    assert lazy_rows_for(Engine(config, ROOFLINE, 100)) is not None

    class Priced(LinearCostModel):  # a cost model of its own: rows lazy only where priced from aggregates
        pass
    assert lazy_rows_for(Engine(config, Priced(), 100)) is None


@pytest.mark.parametrize("think_time", [0.0, 0.3])
def test_closed_loop_clients_of_lazy_rows_match_the_reference(think_time):
    """Clients that send their next request when the last one finishes: a finish inside a jump schedules
    that send at the step's end (SimPy's clock moves with the jump's turns), with no think time too."""
    from workloads import ClosedLoopClients, Independent, ThinkTime, Uniform
    config = EngineConfig(num_gpu_blocks=3000, max_model_len=4096, policy="vllm-v0", async_scheduling=True,
                          eos_token_id=EOS)
    workload = ClosedLoopClients(6, 60, Independent(Uniform(1, 300), Uniform(1, 400)),
                                 think_time=ThinkTime(think_time, cv=1.0) if think_time else 0.0)
    step, fast, counts = run_both(workload, config, ROOFLINE)
    assert_identical(step, fast)
    until = step.end_time / 3
    cut_step, cut_fast, _ = run_both(workload, config, ROOFLINE, until=until)
    assert_identical(cut_step, cut_fast)


def _params(ignore_eos: bool = False) -> SamplingParams:
    return SamplingParams(max_tokens=None, ignore_eos=ignore_eos)


def test_a_private_rows_marked_blocks_are_hashed_from_its_tokens_up_to_date():
    """A request whose first block another request shares later was private while lazy: its blocks were
    marked with its tokens not yet written out. When the other arrives they are hashed, from its tokens
    brought up to date first (else its preempted readmission finds 2 hits, not 128). Found by hypothesis."""
    one = np.array([3], np.int32)
    specs = [RequestSpec(0.0, np.array([4], np.int32), output_len=1, sampling_params=_params(True), request_id="r0"),
             RequestSpec(0.0, one, output_len=130, sampling_params=_params(), request_id="r1")]
    specs += [RequestSpec(0.02, one, output_len=1, sampling_params=_params(), request_id=f"r{i}") for i in range(2, 7)]
    config = EngineConfig(block_size=1, num_gpu_blocks=260, max_model_len=256, max_num_seqs=2,
                          max_num_batched_tokens=256, enable_prefix_caching=True, policy="vllm-v0", eos_token_id=EOS)
    step, fast, counts = run_both(specs, config)
    assert_identical(step, fast)
    assert counts.steps > 0 and sum(step.requests.num_preemptions) == 1


def test_a_preemption_planned_lazily_is_recorded_when_a_jump_ends_its_step():
    """A lazy step whose plan preempted, ended by a jump's first turn: its record counts the preemption.
    Found by hypothesis."""
    long = np.concatenate([np.arange(40, dtype=np.int32) + 500, np.array([3], np.int32)])
    one = np.array([3], np.int32)
    specs = [RequestSpec(0.0, one, output_len=1, sampling_params=_params(True), request_id="r0"),
             RequestSpec(0.0, long, output_len=76, sampling_params=_params(), request_id="r1"),
             RequestSpec(0.0, one, output_len=1, sampling_params=_params(), request_id="r2"),
             RequestSpec(0.0005, one, output_len=1, sampling_params=_params(), request_id="r3"),
             RequestSpec(0.2005, one, output_len=41, sampling_params=_params(), request_id="r4"),
             RequestSpec(0.4005, one, output_len=1, sampling_params=_params(True), request_id="r5"),
             RequestSpec(0.4005, long, output_len=1, sampling_params=_params(), output_token_ids=(3, 3, 3, 3, 3, 3, 2),
                         request_id="r6")]
    config = EngineConfig(block_size=1, num_gpu_blocks=288, max_model_len=256, max_num_seqs=5,
                          max_num_batched_tokens=256, policy="vllm-v0", scheduler_profile="vllm-0.19",
                          async_scheduling=True, eos_token_id=EOS)
    step, fast, counts = run_both(specs, config)
    assert_identical(step, fast)
    assert counts.steps > 0 and sum(step.steps.num_preempted) == 2
