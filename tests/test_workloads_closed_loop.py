"""Closed-loop clients and multi-turn sessions against a fake engine."""
import numpy as np
import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.errors import ConfigError
from workloads import (ClosedLoopClients, ClosedLoopWorkload, Fixed, Independent, SessionWorkload, ThinkTime,
                       Uniform, as_process, is_closed_loop, make_rng, poisson_workload)


class FakeEngine:
    """Finishes each request `base_s + per_token_s * output_len` after submission; tracks concurrency."""

    def __init__(self, env, base_s=1.0, per_token_s=0.001):
        self.env, self.base_s, self.per_token_s = env, base_s, per_token_s
        self.in_flight, self.peak, self.log = 0, 0, []

    def submit(self, spec):
        done = self.env.event()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.log.append((self.env.now, spec))
        self.env.process(self._finish(spec, done))
        return done

    def _finish(self, spec, done):
        yield self.env.timeout(self.base_s + self.per_token_s * spec.output_len)
        self.in_flight -= 1
        done.succeed(spec.request_id)


def run(workload, seed=0, **engine):
    env = simpy.Environment()
    fake = FakeEngine(env, **engine)
    env.process(as_process(workload)(env, fake.submit, make_rng(seed, "workload")))
    env.run()
    return fake, env.now


@given(users=st.integers(1, 12), requests=st.integers(0, 60), think=st.floats(0, 3), base=st.floats(0.01, 2))
def test_concurrency_never_exceeds_users(users, requests, think, base):
    workload = ClosedLoopClients(users, requests, Independent(Uniform(1, 64), Uniform(1, 64)), think_time=think)
    fake, _ = run(workload, base_s=base)
    assert fake.peak <= users and fake.in_flight == 0
    assert sorted(s.request_id for _, s in fake.log) == sorted(f"req-{i}" for i in range(requests))
    if requests >= users:
        assert fake.peak == users


def test_closed_loop_timing_and_determinism():
    workload = ClosedLoopClients(2, 6, Independent(Fixed(8), Fixed(1000)), think_time=ThinkTime(0.5, cv=0))
    assert isinstance(workload, ClosedLoopWorkload) and is_closed_loop(workload)
    fake, end = run(workload)
    assert [t for t, _ in fake.log] == [0, 0, 2.5, 2.5, 5.0, 5.0] and end == pytest.approx(7.5)
    again, _ = run(workload)
    assert all(np.array_equal(a.prompt_token_ids, b.prompt_token_ids) and a.request_id == b.request_id
               for (_, a), (_, b) in zip(fake.log, again.log))


def test_ramp_up_staggers_users():
    fake, _ = run(ClosedLoopClients(4, 4, Independent(Fixed(4), Fixed(1)), think_time=ThinkTime(100, cv=0),
                                 ramp_up_s=8.0))
    assert [t for t, _ in fake.log] == [0, 2, 4, 6]


def test_open_loop_workload_through_as_process():
    fake, _ = run(poisson_workload(5, 30, lengths="azure_conv"), base_s=100)
    assert fake.peak == 30 and [t for t, _ in fake.log] == [s.arrival_time_s for _, s in fake.log]


def check_conversation(specs, eos):
    """Each turn's prompt = the previous prompt + its answer (ending in EOS) + new text."""
    by_session = {}
    for spec in specs:
        by_session.setdefault(spec.session_id, []).append(spec)
    for turns in by_session.values():
        for prev, nxt in zip(turns, turns[1:]):
            history = np.concatenate([prev.prompt_token_ids, np.asarray(prev.output_token_ids, np.int32)])
            assert prev.output_token_ids[-1] == eos and len(prev.output_token_ids) == prev.output_len
            assert nxt.num_prompt_tokens > history.size
            assert np.array_equal(nxt.prompt_token_ids[:history.size], history)
            assert not prev.sampling_params.ignore_eos and prev.sampling_params.max_tokens >= prev.output_len
    return by_session


def test_sessions_closed_loop_grow_prompts_and_wait_for_answers():
    workload = SessionWorkload(8, turns=Uniform(2, 4), think_time=ThinkTime(2.0, cv=0), eos_token_id=7)
    fake, _ = run(workload, base_s=1.0, per_token_s=0.0)
    specs = [s for _, s in fake.log]
    sessions = check_conversation(specs, eos=7)
    assert len(sessions) == 8 and all(2 <= len(t) <= 4 for t in sessions.values())
    for turns in sessions.values():
        gaps = np.diff([s.arrival_time_s for s in turns])
        assert np.allclose(gaps, 3.0)  # 1 s answer + 2 s think


def test_sessions_open_loop_sorted_and_same_content_as_closed_loop():
    workload = SessionWorkload(20, think_time=1.0, assumed_ttft_s=0.2, assumed_tpot_s=0.01)
    specs = list(workload.iter_requests(make_rng(0, "workload")))
    times = [s.arrival_time_s for s in specs]
    assert times == sorted(times) and [s.request_id for s in specs] == [f"req-{i}" for i in range(len(specs))]
    check_conversation(specs, eos=workload.eos_token_id)
    fake, _ = run(workload)
    key = lambda s: (s.session_id, s.num_prompt_tokens)
    closed = sorted((s for _, s in fake.log), key=key)
    assert [key(s) for s in closed] == [key(s) for s in sorted(specs, key=key)]


def test_sessions_respect_max_model_len():
    workload = SessionWorkload(10, turns=Fixed(8), max_model_len=2048)
    specs = list(workload.iter_requests(make_rng(1)))
    assert all(s.num_prompt_tokens + s.output_len <= 2048 for s in specs)
    assert len(specs) < 80


@pytest.mark.parametrize("build, field", [
    (lambda: ClosedLoopClients(0, 10), "num_users"), (lambda: ClosedLoopClients(2, -1), "num_requests"),
    (lambda: ClosedLoopClients(2, 5, think_time=-1.0), "think_time.mean_s"),
    (lambda: SessionWorkload(3, max_model_len=1), "max_model_len"),
    (lambda: SessionWorkload(3, eos_token_id=-2), "eos_token_id"),
])
def test_bad_closed_loop_parameters(build, field):
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.field == field


@pytest.mark.parametrize("kwargs, field, value", [
    (dict(num_users=True), "num_users", True),
    (dict(max_tokens=0), "max_tokens", 0),
    (dict(priority=1.5), "priority", 1.5),
    (dict(think_time="2"), "think_time", "2"),
    (dict(lengths=Fixed(5)), "lengths", Fixed(5)),
])
def test_closed_loop_clients_name_a_bad_argument_at_construction(kwargs, field, value):
    with pytest.raises(ConfigError) as err:
        ClosedLoopClients(**{"num_users": 4, "num_requests": 10, **kwargs})
    assert err.value.field == field and err.value.value == value


@pytest.mark.parametrize("kwargs, field", [(dict(num_sessions=True), "num_sessions"), (dict(turns=0), "turns"),
                                           (dict(session_arrivals=5), "session_arrivals")])
def test_session_workload_names_a_bad_argument_at_construction(kwargs, field):
    with pytest.raises(ConfigError) as err:
        SessionWorkload(**{"num_sessions": 2, **kwargs})
    assert err.value.field == field
