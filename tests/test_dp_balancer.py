"""vLLM's DP load balancing over counts the coordinator publishes at most every 100 ms."""
import pytest
from hypothesis import given, strategies as st

from sim.api.dp_balancer import IDLE_PUBLISH_INTERVAL_S, PUBLISH_INTERVAL_S, DelayedLoadView


def test_requests_routed_between_publishes_count_as_waiting_on_their_rank():
    view = DelayedLoadView(2)
    assert [view.route(0.01) for _ in range(4)] == [0, 1, 0, 1]  # 4 x waiting: each request moves the score


def test_a_rank_that_freed_seats_is_seen_only_at_the_next_publish():
    view = DelayedLoadView(2)
    view.report(0, 0, 10, now=0.20)   # rank 0 busy, rank 1 busier: published at once (100 ms since start-up)
    view.report(1, 0, 20, now=0.20)
    assert view.route(0.21) == 0
    view.report(1, 0, 2, now=0.25)    # rank 1 frees 18 seats; the last publish was at 0.20
    assert view.route(0.25 + 1e-9) == 0 and view.route(0.29) == 0
    assert view.route(0.20 + PUBLISH_INTERVAL_S) == 1   # published at 0.30: rank 1 now looks emptier


def test_unchanged_counts_are_republished_every_four_seconds_resetting_the_front_ends_own():
    view = DelayedLoadView(2)
    view.report(0, 0, 0, now=0.5)     # nothing changed: no publish but the idle one
    for _ in range(3):
        view.route(1.0)               # counted as waiting on ranks 0, 1, 0
    assert view.view == [[2, 0], [1, 0]]
    view.route(IDLE_PUBLISH_INTERVAL_S)  # the idle publish at 4 s replaced them with the reports (all 0)
    assert view.view == [[1, 0], [0, 0]]


EVENTS = st.lists(st.one_of(
    st.tuples(st.floats(0, 20), st.just("report"), st.integers(0, 2), st.integers(0, 5), st.integers(0, 50)),
    st.tuples(st.floats(0, 20), st.just("route"), st.just(0), st.just(0), st.just(0))), max_size=80)


@given(EVENTS)
def test_the_front_end_routes_by_the_last_publish_plus_its_own_routing_since(events):
    """Whatever the reports, each request goes to the lowest 4 x waiting + running (lowest rank on ties)
    in the last published counts plus one waiting request per routing since that publish; publishes are
    at least 100 ms apart and never ahead of the event that makes them."""
    view = DelayedLoadView(3)
    publishes, base, routed = [0.0], [[0, 0]] * 3, [0, 0, 0]
    for now, kind, rank, waiting, running in sorted(events):
        before = view.last_publish
        if kind == "report":
            view.report(rank, waiting, running, now)
        else:
            seen = [list(c) for c in view.view]
            chosen = view.route(now)
        if view.last_publish != before:
            assert before < view.last_publish <= now
            publishes.append(view.last_publish)
            base, routed = [list(c) for c in view.view], [0, 0, 0]
            if kind == "route":
                base[chosen][0] -= 1
                seen = [list(c) for c in base]
        if kind == "route":
            score = [4 * w + r for w, r in seen]
            assert chosen == score.index(min(score))
            routed[chosen] += 1
        assert view.view == [[w + n, r] for (w, r), n in zip(base, routed)]
    assert all(b - a >= PUBLISH_INTERVAL_S - 1e-9 for a, b in zip(publishes, publishes[1:]))


def test_a_rank_reports_after_a_step_without_the_requests_that_arrived_during_it():
    """vLLM's engine takes a request that arrives mid-step from its input queue after the step, so the
    counts it reports for that step leave it out; the next step's report has it."""
    import simpy

    from sim.api.data_parallel import LockstepDP
    from sim.core.config import EngineConfig
    from sim.core.cost import LinearCostModel
    from sim.engine.engine import Engine
    from workloads import RequestSpec

    class Recording(DelayedLoadView):
        def report(self, rank, waiting, running, now):
            reports.append((now, rank, waiting, running))
            super().report(rank, waiting, running, now)

    class FixedStep:
        def step_time(self, batches):
            return 0.5

    reports: list = []
    env = simpy.Environment()
    engines = [Engine(EngineConfig(num_gpu_blocks=200, max_num_seqs=1, max_model_len=1024), LinearCostModel(), 200) for _ in range(2)]
    lockstep = LockstepDP(env, engines, FixedStep())
    lockstep.balancer = Recording(2)
    spec = lambda i: RequestSpec(arrival_time_s=0.0, prompt_token_ids=[1] * 8, output_len=4, request_id=f"r{i}")

    def arrivals():
        lockstep.submit(spec(0))          # rank 0 runs it from t = 0; its steps end at 0.5, 1.0, ...
        yield env.timeout(0.2)
        lockstep.submit(spec(1))          # rank 1 (rank 0 counts 1 waiting in the front end's view)
        lockstep.submit(spec(2))          # rank 0 again: it waits there behind r0 (one seat)
    env.process(arrivals())
    env.run(until=1.2)
    first = [r for r in reports if r[0] == 0.5]
    assert first == [(0.5, 0, 0, 1), (0.5, 1, 0, 0)]   # r1 and r2 arrived mid-step: not in these counts
    assert (1.0, 0, 1, 1) in reports                   # one step later r2 waits on rank 0


@pytest.mark.parametrize("async_scheduling, first_token_at", [(False, 1.5), (True, 2.0)])
def test_lockstep_ranks_plan_ahead_under_async_scheduling(async_scheduling, first_token_at):
    """As one engine does: under async scheduling a busy rank plans step N+1 when step N starts, so a
    request that reaches it during step N runs from step N+2."""
    import simpy

    from sim.api.data_parallel import LockstepDP
    from sim.core.config import EngineConfig
    from sim.core.cost import LinearCostModel
    from sim.engine.engine import Engine
    from workloads import RequestSpec

    class FixedStep:
        def step_time(self, batches):
            return 0.5

    env = simpy.Environment()
    config = EngineConfig(num_gpu_blocks=200, max_model_len=1024, async_scheduling=async_scheduling)
    engines = [Engine(config, LinearCostModel(), 200) for _ in range(2)]
    lockstep = LockstepDP(env, engines, FixedStep())
    spec = lambda i, n: RequestSpec(arrival_time_s=0.0, prompt_token_ids=[1] * 8, output_len=n, request_id=f"r{i}")

    def arrivals():
        lockstep.submit(spec(0, 20))      # rank 0, busy from t = 0; steps end at 0.5, 1.0, 1.5, ...
        lockstep.submit(spec(1, 20))      # rank 1
        yield env.timeout(0.7)
        lockstep.submit(spec(2, 2))       # rank 0 (tie), during the step from 0.5 to 1.0
    env.process(arrivals())
    env.run(until=3.0)
    assert engines[0].requests.first_token_time[1] == first_token_at
