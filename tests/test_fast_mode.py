"""The fast engine (leaps over quiet stretches) gives the reference step-by-step engine's records, bit
for bit: every step row, request column and token time, over random workloads (issue 15)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.errors import ConfigError
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.sampling_params import SamplingParams
from sim.engine.engine import Engine
from sim.engine.leap import make_leaper
from sim.engine.leap_plan import StretchPlan
from sim.engine.leap_steady import quiet_horizon
from sim.engine.simulation import EngineProcess, run_engine, start_workload
from workloads import poisson_workload
from workloads.spec import RequestSpec
from workloads.token_streams import natural_length, read_tokens, stream_for, synthetic_rows, synthetic_spans

EOS = 2


@st.composite
def long_runs(draw, max_requests: int = 10):
    """Requests with long decodes (so stretches are long), shared prefixes, stop tokens, stop
    strings, priorities and client aborts."""
    specs, t = [], 0.0
    for i in range(draw(st.integers(1, max_requests))):
        t += draw(st.sampled_from([0.0, 0.0005, 0.003, 0.02, 0.2]))
        prefix = draw(st.sampled_from([0, 0, 16, 40]))
        body = draw(st.lists(st.integers(3, 40), min_size=1, max_size=60))
        prompt = np.concatenate([np.arange(prefix, dtype=np.int32) + 500, np.asarray(body, np.int32)])
        stream = draw(st.none() | st.lists(st.integers(2, 12), min_size=1, max_size=120))
        max_tokens = draw(st.none() | st.integers(1, 150))
        params = SamplingParams(max_tokens=max_tokens,
                                min_tokens=min(draw(st.sampled_from([0, 0, 3])), max_tokens or 3),
                                ignore_eos=draw(st.booleans()),
                                stop_token_ids=draw(st.sampled_from([(), (), (7,)])),
                                stop=draw(st.sampled_from([(), (), (), ("\x05\x06",)])))
        abort = draw(st.none() | st.floats(0.0, 0.5)) if draw(st.integers(0, 4)) == 0 else None
        specs.append(RequestSpec(t, prompt, output_len=draw(st.integers(1, 200)),
                                 output_token_ids=None if stream is None else tuple(stream),
                                 sampling_params=params, request_id=f"r{i}",
                                 priority=draw(st.integers(0, 2)),
                                 abort_time_s=None if abort is None else t + abort))
    return specs


@st.composite
def configs(draw, max_model_len: int = 256):
    """Random budgets, KV sizes (down to one request's worth: preemptions), block sizes, policies,
    stop and scheduler profiles, sync or async scheduling."""
    block_size = draw(st.sampled_from([1, 4, 16]))
    min_blocks = -(-max_model_len // block_size) + 1
    chunked = draw(st.booleans())
    policy = draw(st.sampled_from(["vllm", "vllm", "vllm", "vllm-v0", "sarathi"] if chunked else ["vllm", "vllm-v0"]))
    whole = not chunked or policy == "vllm-v0"
    return EngineConfig(
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(min_blocks, 4 * min_blocks)),
        max_model_len=max_model_len,
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(max_model_len, 800)) if whole else draw(st.integers(1, 600)),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 8, 50])),
        enable_prefix_caching=draw(st.booleans()),
        scheduler_reserve_full_isl=draw(st.booleans()),
        scheduling=draw(st.sampled_from(["fcfs", "priority"])),
        policy=policy,
        stop_profile=draw(st.sampled_from(["vllm", "vllm-v1-2025", "vllm-v0"])),
        scheduler_profile=draw(st.sampled_from(["vllm", "vllm-0.19"])),
        async_scheduling=draw(st.sampled_from([None, True, False])),
        eos_token_id=EOS,
    )


def run_both(specs, config):
    step = run_engine(specs, replace(config, mode="step"), LinearCostModel())
    fast = run_engine(specs, replace(config, mode="fast"), LinearCostModel())
    return step, fast


def assert_identical(step, fast) -> None:
    """Same step table, request table, token times and end time, compared bit for bit (repr)."""
    for name, column in step.steps.columns().items():
        assert repr(list(fast.steps.columns()[name])) == repr(list(column)), f"steps.{name}"
    for name, column in step.requests.columns().items():
        assert repr(list(fast.requests.columns()[name])) == repr(list(column)), f"requests.{name}"
    assert [None if t is None else list(t) for t in fast.requests.token_times] == \
        [None if t is None else list(t) for t in step.requests.token_times]
    assert repr(fast.end_time) == repr(step.end_time)


@given(long_runs(), configs())
def test_fast_mode_gives_the_reference_records_bit_for_bit(specs, config):
    assert_identical(*run_both(specs, config))


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("num_gpu_blocks,rate", [(30_000, 2.0), (30_000, 30.0), (1_500, 30.0)])
def test_fast_mode_identical_on_sharegpt_runs(async_scheduling, num_gpu_blocks, rate):
    """Light load, overload with a long queue, and KV so small that requests are preempted."""
    config = EngineConfig(num_gpu_blocks=num_gpu_blocks, max_model_len=16384, max_num_batched_tokens=8192,
                          async_scheduling=async_scheduling)
    workload = poisson_workload(rate=rate, num_requests=120, lengths="sharegpt")
    step, fast = run_both(workload, config)
    assert_identical(step, fast)
    if num_gpu_blocks < 2000:
        assert sum(step.requests.num_preemptions) > 0  # the case really preempts


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_long_decode_is_leapt_not_stepped(async_scheduling):
    """One request decoding 500 tokens: nearly all its steps are done by leaps."""
    spec = RequestSpec(0.0, np.arange(10, dtype=np.int32) + 100, output_len=500,
                       sampling_params=SamplingParams(max_tokens=None))
    config = EngineConfig(num_gpu_blocks=200, max_model_len=1024, async_scheduling=async_scheduling, mode="fast")
    env = simpy.Environment()
    engine = Engine(config, LinearCostModel(), 200)
    process = EngineProcess(env, engine)
    start_workload(env, [spec], process.submit, seed=0)
    env.run()
    assert engine.requests.finish_reason == ["stop"] and len(engine.steps) >= 500
    assert process.leaper.steps_leapt >= 490


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_the_token_update_reads_each_stream_ahead_and_drops_it_at_the_finish(async_scheduling):
    """A request that runs past its EOS (`ignore_eos`) emits its stream's tokens, read ahead past the
    natural length and then twice as far each time; no read-ahead list outlives its request."""
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    specs = [RequestSpec(0.0, np.arange(10, dtype=np.int32) + 100, output_len=40 + i, sampling_params=params)
             for i in range(3)]
    config = EngineConfig(num_gpu_blocks=200, max_model_len=1024, async_scheduling=async_scheduling, mode="step")
    env = simpy.Environment()
    engine = Engine(config, LinearCostModel(), 200)
    finish, outputs = engine._finish, {}

    def finished(req, status, now):
        outputs[req.index] = (list(req.output_token_ids), engine.streams[req.index])
        finish(req, status, now)

    engine._finish = finished
    start_workload(env, specs, EngineProcess(env, engine).submit, seed=0)
    env.run()
    assert engine.requests.finish_reason == ["length"] * 3
    for tokens, stream in outputs.values():
        assert tokens == [stream(p) for p in range(300)]
    assert engine.stream_tokens == [None] * 3


def test_unknown_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="mode"):
        EngineConfig(mode="turbo")


def test_no_leaper_where_unsupported():
    """Invariant checks after every step, and other policies, run step by step."""
    assert make_leaper(Engine(EngineConfig(check_invariants=True), LinearCostModel(), 1000)) is None
    assert make_leaper(Engine(EngineConfig(policy="orca", max_num_batched_tokens=8192), LinearCostModel(),
                              1000)) is None


@given(st.none() | st.lists(st.integers(0, 50), max_size=30), st.integers(1, 60), st.integers(0, 9),
       st.integers(0, 80), st.integers(0, 40))
def test_a_streams_span_reads_what_its_positions_read(scripted, output_len, index, start, count):
    spec = RequestSpec(0.0, np.arange(3, dtype=np.int32) + 5, output_len=output_len,
                       output_token_ids=None if scripted is None else tuple(scripted))
    stream = stream_for(spec, index, EOS)
    assert stream.span(start, start + count).tolist() == [stream(p) for p in range(start, start + count)]


@given(st.none() | st.lists(st.integers(0, 50), max_size=30), st.none() | st.integers(1, 60), st.integers(0, 9),
       st.integers(0, 80), st.integers(0, 40), st.sampled_from([EOS, None]))
def test_a_streams_tokens_read_ahead_are_what_its_positions_read(scripted, output_len, index, start, count, eos):
    """`read_tokens` (what the engine's token update reads ahead) gives each position's token, for
    scripted streams, synthetic ones and those with no EOS id; `natural_length` ends at the EOS."""
    spec = RequestSpec(0.0, np.arange(3, dtype=np.int32) + 5, output_len=output_len,
                       output_token_ids=None if scripted is None else tuple(scripted))
    stream = stream_for(spec, index, eos)
    assert read_tokens(stream, start, start + count) == [stream(p) for p in range(start, start + count)]
    synthetic = scripted is None and eos is not None and output_len is not None
    assert natural_length(stream) == (output_len if synthetic else 0)


@given(st.lists(st.tuples(st.none() | st.integers(1, 60), st.integers(0, 10**6), st.integers(0, 80)),
                min_size=1, max_size=6), st.integers(0, 40))
def test_synthetic_spans_read_what_each_streams_positions_read(rows, count):
    streams = [stream_for(RequestSpec(0.0, np.arange(3, dtype=np.int32) + 5, output_len=output_len), index, EOS)
               for output_len, index, _ in rows]
    starts = np.array([start for _, _, start in rows], dtype=np.int64)
    tokens = synthetic_spans([s.synthetic for s in streams], starts, count)
    expected = [[s(p) for p in range(start, start + count)] for s, start in zip(streams, starts.tolist())]
    assert tokens.tolist() == expected
    assert synthetic_rows([s.synthetic for s in streams], starts.tolist(), count) == expected


@given(st.lists(st.tuples(st.integers(0, 10**7), st.integers(-1, 25_000), st.integers(0, 25_000)),
                min_size=1, max_size=4), st.sampled_from([0, 1, 7, 4096, 20_000, 20_001]))
def test_synthetic_rows_match_the_spans_at_any_offset_and_length(rows, count):
    """The filler cycle's slices wrap where positions pass a period (and past one period, the rows
    fall back to the spans)."""
    params = [(offset, eos_position, EOS) for offset, eos_position, _ in rows]
    starts = [start for _, _, start in rows]
    assert synthetic_rows(params, starts, count) == synthetic_spans(params, np.array(starts, np.int64), count).tolist()


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_fast_mode_identical_with_closed_loop_clients_and_until(async_scheduling):
    """Clients that send their next request when the last one finishes (plus think time), and a run
    cut short by `until`: leaps never cross either."""
    from workloads import ClosedLoopClients, Independent, ThinkTime, Uniform
    config = EngineConfig(num_gpu_blocks=3000, max_model_len=4096, async_scheduling=async_scheduling)
    workload = ClosedLoopClients(6, 60, Independent(Uniform(1, 300), Uniform(1, 400)),
                                 think_time=ThinkTime(0.3, cv=1.0))
    step, fast = run_both(workload, config)
    assert_identical(step, fast)
    cut = EngineConfig(num_gpu_blocks=3000, max_model_len=4096, async_scheduling=async_scheduling)
    until = step.end_time / 3
    assert_identical(run_engine(workload, replace(cut, mode="step"), LinearCostModel(), until=until),
                     run_engine(workload, replace(cut, mode="fast"), LinearCostModel(), until=until))


def test_quiet_horizon_passes_only_events_nothing_waits_on():
    """A succeeded event with no callbacks (an open-loop request's `done`) does nothing when SimPy
    processes it: a leap may pass it; a timeout a process waits on, or a failed event, it may not."""
    env = simpy.Environment()
    assert quiet_horizon(env) == float("inf")
    env.event().succeed()                      # at 0, nothing waits on it
    assert env.peek() == 0 and quiet_horizon(env) == float("inf")

    def waiter():
        yield env.timeout(2.5)
    env.process(waiter())                      # its Initialize event at 0 has a callback
    assert quiet_horizon(env) == 0
    env.step()
    env.step()                                 # the process now waits on its timeout at 2.5
    assert quiet_horizon(env) == 2.5
    failed = env.event()
    failed.fail(RuntimeError("boom"))          # would stop the run when processed
    assert quiet_horizon(env) == 0


@st.composite
def crowded(draw):
    """A KV cache of one to two requests' worth, prefix caching on and whole-sequence reservation:
    the waiting head (often a preempted request whose cached blocks sit in the free queue) stays
    out while running rows take those blocks, so stretches pass evictions of its prefix chain."""
    config = draw(configs(max_model_len=128))
    blocks = -(-128 // config.block_size) + 1
    return replace(config, enable_prefix_caching=True, scheduler_reserve_full_isl=True,
                   num_gpu_blocks=draw(st.integers(blocks, 2 * blocks)))


@given(long_runs(max_requests=12), crowded())
def test_fast_mode_identical_when_the_waiting_head_cannot_fit(specs, config):
    assert_identical(*run_both(specs, config))


def test_a_stretch_passes_evictions_of_the_waiting_heads_prefix():
    """Four requests sharing a 64-token prefix on a cache too small for all (they preempt each
    other): a preempted one waits (its whole sequence does not fit) while the others decode into
    the free blocks that still hold its prefix. Those steps are leapt (~250 of 348 when every such
    eviction ended a stretch), and the records are the reference's."""
    prefix = np.arange(64, dtype=np.int32) + 500
    specs = [RequestSpec(0.01 * i, np.concatenate([prefix, np.asarray([7 + i] * 8, np.int32)]), output_len=150,
                         sampling_params=SamplingParams(max_tokens=None), request_id=f"r{i}") for i in range(4)]
    config = EngineConfig(block_size=4, num_gpu_blocks=70, max_model_len=256, max_num_seqs=4,
                          max_num_batched_tokens=256, enable_prefix_caching=True, eos_token_id=EOS)
    assert_identical(*run_both(specs, config))
    env = simpy.Environment()
    engine = Engine(replace(config, mode="fast"), LinearCostModel(), 70)
    process = EngineProcess(env, engine)
    start_workload(env, specs, process.submit, seed=0)
    env.run()
    assert process.leaper.steps_leapt > 300


@given(st.integers(1, 300), st.integers(0, 10**6), st.integers(0, 400), st.sampled_from([2, None, 5000]))
def test_synthetic_streams_emit_filler_ids_but_eos(output_len, index, position, eos):
    """What the leap's stop test for synthetic rows rests on: every token is in FILLER_RANGE except
    the EOS id at the EOS position (so a stop set without filler ids can only fire there)."""
    from workloads.token_streams import FILLER_RANGE
    stream = stream_for(RequestSpec(0.0, np.arange(3, dtype=np.int32) + 5, output_len=output_len), index, eos)
    if eos is None:
        assert stream.synthetic is None  # (the leap reads such a stream's tokens one by one)
        return
    token = stream(position)
    if position == output_len - 1:
        assert token == eos and stream.synthetic[1:] == (output_len - 1, eos)
    else:
        assert token in FILLER_RANGE


@given(st.lists(st.tuples(st.floats(0, 10), st.booleans()), max_size=60))
def test_quiet_horizon_is_the_first_event_anything_waits_on(events):
    """Over random queues of timeouts, some waited on: the horizon is the earliest waited-on one,
    or earlier (never later) when many that nothing waits on come first."""
    from simpy.events import Initialize

    env = simpy.Environment()

    def waiter(timeout):
        yield timeout
    for delay, waited in events:
        timeout = env.timeout(delay)
        if waited:
            env.process(waiter(timeout))
    while any(isinstance(entry[3], Initialize) for entry in env._queue):
        env.step()  # start the waiters (urgent: before any timeout); each then waits on its timeout
    waited_on = [t for t, _, _, e in env._queue if e.callbacks]
    expected = min(waited_on, default=float("inf"))
    horizon = quiet_horizon(env)
    assert horizon <= expected
    if len(env._queue) <= 32:
        assert horizon == expected


def without_lazy_rows(monkeypatch) -> None:
    """Leave rows eager (sim.engine.lazy_rows): vLLM V0's quiet steps under async scheduling are then the
    leaper's, as where lazy rows do not apply (another cost model, a KV manager of its own)."""
    monkeypatch.setattr(Engine, "keep_rows_lazy", lambda engine: False)


def test_a_leap_starts_while_a_v0_prefill_step_is_in_flight(monkeypatch):
    """vLLM V0 runs a step of prefills alone: with it in flight (async), the running decodes have
    nothing in flight and sample from the next step on, the new requests sample their first token at
    its end. A stretch starts there (rows that skip its first unit), with the reference's records."""
    without_lazy_rows(monkeypatch)
    starts = []
    apply = StretchPlan.apply

    def counting_apply(plan):
        starts.append(plan.skips is not None)
        return apply(plan)
    monkeypatch.setattr(StretchPlan, "apply", counting_apply)
    specs = [RequestSpec(0.2 * i, np.arange(20, dtype=np.int32) + 100 + i, output_len=200,
                         sampling_params=SamplingParams(max_tokens=None), request_id=f"r{i}") for i in range(12)]
    config = EngineConfig(num_gpu_blocks=400, max_model_len=1024, policy="vllm-v0", async_scheduling=True,
                          enable_prefix_caching=True, eos_token_id=EOS)
    assert_identical(*run_both(specs, config))
    assert sum(starts) >= 8


def _checking_leap(checked: list):
    """Leaper.leap that asserts, whenever the rows kept from a refused pass (`watch`) refuse an
    attempt cheaply, that the full check (`_steady_rows`: the pass over the rows) refuses too."""
    import sim.engine.leap as leap
    original = leap.Leaper.leap

    def leap_checked(leaper, in_flight, now):
        if not leaper.cooldown and leaper.watch is not None and leaper._still_blocked():
            assert type(leaper._steady_rows(in_flight, now, quiet_horizon(leaper.env))) is not tuple
            checked.append(len(leaper.watch))
        return original(leaper, in_flight, now)
    return leap_checked


@given(long_runs(max_requests=12), configs())
def test_a_row_near_its_length_rule_refuses_only_where_the_pass_over_the_rows_would(specs, config):
    import sim.engine.leap as leap
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(leap.Leaper, "leap", _checking_leap([]))
        fast = run_engine(specs, replace(config, mode="fast"), LinearCostModel())
    assert_identical(run_engine(specs, replace(config, mode="step"), LinearCostModel()), fast)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_big_batches_refuse_by_the_row_near_its_length_rule(monkeypatch, async_scheduling):
    """Many rows with staggered length limits: some row is always near its limit (a big batch's
    shortest stretch worth a leap is longer); attempts are then refused by the rows watched (checked
    against the full pass), with the reference's records, and no leap is shorter than that. Then one
    long decode alone: the last such row, finished, refuses nothing."""
    import sim.engine.leap as leap
    from sim.engine.leap_steady import MIN_UNITS, least_units
    without_lazy_rows(monkeypatch)
    checked, leaps = [], []
    monkeypatch.setattr(leap.Leaper, "leap", _checking_leap(checked))
    apply = StretchPlan.apply

    def recording_apply(plan):
        leaps.append((plan.num_rows, plan.units))
        return apply(plan)
    monkeypatch.setattr(StretchPlan, "apply", recording_apply)
    specs = [RequestSpec(0.0002 * i, np.arange(12, dtype=np.int32) + 100 + i, output_len=800,
                         sampling_params=SamplingParams(max_tokens=20 + 3 * i), request_id=f"r{i}")
             for i in range(100)] + [RequestSpec(0.05, np.arange(12, dtype=np.int32) + 50, output_len=600,
                                                 sampling_params=SamplingParams(max_tokens=None), request_id="long")]
    config = EngineConfig(num_gpu_blocks=8000, max_model_len=1024, policy="vllm-v0", max_num_seqs=128,
                          async_scheduling=async_scheduling, eos_token_id=EOS)
    assert_identical(*run_both(specs, config))
    assert least_units(100) > MIN_UNITS and len(checked) >= 10, len(checked)
    assert max(checked) > 1  # the rows next nearest their limits are watched too
    assert all(units >= least_units(rows) for rows, units in leaps)
    assert sum(units for rows, units in leaps if rows == 1) > 250  # the long decode alone (~280 steps)


def _recording_tails(monkeypatch) -> list:
    """Patch Leaper.finish_tail to record (may_stop, rows left out of the tail's plan, requests it
    retired) of every tail."""
    import sim.engine.leap as leap
    tails = []
    finish_tail = leap.Leaper.finish_tail

    def recording(leaper, now):
        plan = leaper.tail
        running = len(leaper.engine.state.running)
        finish_tail(leaper, now)
        tails.append((plan.may_stop, len(plan.left), running - len(leaper.engine.state.running)))
    monkeypatch.setattr(leap.Leaper, "finish_tail", recording)
    return tails


@pytest.mark.parametrize("policy,async_scheduling", [("vllm", True), ("vllm", False), ("vllm-v0", True),
                                                     ("vllm-v0", False)])
def test_a_stretch_ends_inside_the_step_an_arrival_lands_in_and_at_a_rows_stop(monkeypatch, policy,
                                                                                async_scheduling):
    """Spaced arrivals and staggered lengths: stretches take their tail (the step a plain arrival lands
    in, the step a row stops in: by EOS, by max_tokens, and under vLLM V1's async plans with the
    row's last token in flight left out of the tail's plan) with the reference's records."""
    without_lazy_rows(monkeypatch)
    tails = _recording_tails(monkeypatch)
    specs = [RequestSpec(0.05 * i + 0.013 * (i % 3), np.arange(12, dtype=np.int32) + 100 + i,
                         output_len=40 + 17 * (i % 5),
                         sampling_params=SamplingParams(max_tokens=30 + 11 * (i % 4) if i % 2 else None),
                         request_id=f"r{i}") for i in range(24)]
    config = EngineConfig(num_gpu_blocks=4000, max_model_len=1024, policy=policy,
                          async_scheduling=async_scheduling, eos_token_id=EOS)
    assert_identical(*run_both(specs, config))
    assert any(not may_stop for may_stop, _, _ in tails)       # an arrival's
    assert sum(retired for _, _, retired in tails) >= 12        # most stops end a stretch's tail
    if policy == "vllm" and async_scheduling:
        assert any(left for _, left, _ in tails)


def test_no_tail_past_an_arrival_with_an_abort_time(monkeypatch):
    """An arrival that starts an abort timer is an event a stretch stops before (its tail would run
    past what it does)."""
    import sim.engine.leap as leap
    seen = []
    lands = leap.Leaper.arrival_lands_in

    def recording(leaper, start, end):
        result = lands(leaper, start, end)
        seen.append(result)
        return result
    monkeypatch.setattr(leap.Leaper, "arrival_lands_in", recording)
    specs = [RequestSpec(0.1 * i, np.arange(12, dtype=np.int32) + 100 + i, output_len=300,
                         sampling_params=SamplingParams(max_tokens=None), request_id=f"r{i}",
                         abort_time_s=0.1 * i + 5.0) for i in range(6)]
    config = EngineConfig(num_gpu_blocks=4000, max_model_len=1024, eos_token_id=EOS)
    assert_identical(*run_both(specs, config))
    assert seen and not any(seen)


@pytest.mark.parametrize("case", ["plain", "another engine", "abort timer", "next arrival inside", "outside"])
def test_only_a_plain_arrival_into_this_engine_may_land_inside_a_tail(case):
    from sim.engine.leap_steady import ArrivalTimeout
    env = simpy.Environment()
    engine = Engine(EngineConfig(num_gpu_blocks=100, max_model_len=1024), LinearCostModel(), 100)
    submit = object()
    leaper = make_leaper(engine, env, (submit,))
    spec = RequestSpec(1.0, np.arange(4, dtype=np.int32), output_len=5,
                       abort_time_s=2.0 if case == "abort timer" else None)
    arrival = ArrivalTimeout(env, 1.0, spec, object() if case == "another engine" else submit,
                             1.2 if case == "next arrival inside" else 1.6)
    arrival.callbacks.append(lambda event: None)  # (a process waits on it)
    start = 1.1 if case == "outside" else 0.5
    assert leaper.arrival_lands_in(start, 1.5) == (case == "plain")
