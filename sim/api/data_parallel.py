"""Data parallelism with expert parallelism: vLLM's --data-parallel-size with --enable-expert-parallel.

vLLM (0.19) runs one engine core per DP rank, each with its own scheduler and KV cache (TP 1 here). With
a MoE model and expert parallelism every MoE layer exchanges tokens between the ranks, so all ranks step
together; a rank without work runs a dummy batch, and the step lasts as long as the slowest rank
(kernels_cost_model.expert_parallel prices it). New requests go to the least-loaded rank by vLLM's DP
load-balancing score, 4 x waiting + running (`DPLBAsyncMPClient`), lowest rank on ties, over the counts the
DP coordinator last published (sim.api.dp_balancer: at most every 100 ms).

Used by `simulate()` when `deployment.data_parallel_size > 1` and by the fidelity replay (sim.fidelity.dp).
"""
from __future__ import annotations

import simpy

from kernels_cost_model.errors import require
from sim.api.dp_balancer import DelayedLoadView
from sim.engine.engine import Engine
from sim.engine.simulation import check_all_finished, run_env, start_workload, watch_finishes


class LockstepDP:
    """DP ranks under one loop: plan every rank, price the step jointly, finish every rank."""

    def __init__(self, env: simpy.Environment, engines: list[Engine], cost):
        self.env, self.engines, self.cost = env, engines, cost
        self.wakeup: simpy.Event | None = None
        self.done_events: dict = {}
        self.balancer = DelayedLoadView(len(engines), env.now)
        #: per rank, requests that arrived while the step in flight runs: vLLM's engine takes them from its
        #: input queue after the step, so the counts it reports for that step leave them out
        self.arrived_in_step: list[list] | None = None
        for engine in engines:
            engine.on_finish = self._on_finish
        env.process(self.loop())

    def submit(self, spec) -> simpy.Event:
        """Hand a request to the least-loaded rank now; the event succeeds when it finishes."""
        rank = self.balancer.route(self.env.now)
        done = self.env.event()
        req = self.engines[rank].add_request(spec, self.env.now)
        if req.is_finished:
            done.succeed(req)
            return done
        if self.arrived_in_step is not None:
            self.arrived_in_step[rank].append(req)
        self.done_events[req] = done
        if spec.abort_time_s is not None:
            self.env.process(self._abort_at(self.engines[rank], req.request_id, spec.abort_time_s))
        self._wake()
        return done

    def _abort_at(self, engine: Engine, request_id: str, when: float):
        yield self.env.timeout(max(0.0, when - self.env.now))
        engine.abort(request_id, self.env.now)
        self._wake()

    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()

    def _on_finish(self, req) -> None:
        done = self.done_events.pop(req, None)
        if done is not None:
            done.succeed(req)

    def loop(self):
        """Plan every rank, price the step jointly, let it pass, finish every rank. Under async scheduling
        (vLLM's default, DP included) each rank plans its next step when this one starts, before this
        one's tokens are known, as the single engine's loop does (sim.engine.simulation)."""
        env, engines = self.env, self.engines
        ahead = engines[0].is_async
        steps = [None] * len(engines)
        while True:
            steps = [s if s is not None or not e.has_work else e.plan_step(env.now) for e, s in zip(engines, steps)]
            if all(s is None for s in steps):
                self.wakeup = env.event()
                yield self.wakeup
                self.wakeup = None
                continue
            following = [e.plan_step(env.now) if ahead and e.has_work else None for e in engines]
            duration = self.cost.step_time([s.batch if s else None for s in steps])
            for s in steps:
                if s is not None:
                    s.duration = duration
            self.arrived_in_step = [[] for _ in engines]
            yield env.timeout(duration)
            self._finish(steps)
            steps = following

    def _finish(self, steps: list) -> None:
        """Every rank's results at the step's end, then its counts to the DP coordinator (leaving out
        the requests that arrived during the step: vLLM's engine reads them from its input queue after)."""
        arrived, self.arrived_in_step = self.arrived_in_step, None
        now = self.env.now
        for rank, (engine, s) in enumerate(zip(self.engines, steps)):
            if s is not None:
                engine.finish_step(s, now)
            waiting = len(engine.state.waiting) - sum(not req.is_finished for req in arrived[rank])
            self.balancer.report(rank, waiting, len(engine.state.running), now)


def check_data_parallel(deployment, speculative_config=None) -> None:
    """What `data_parallel_size > 1` needs here; anything else is a named error."""
    dp = deployment.data_parallel_size
    if dp == 1:
        return
    field = "deployment.data_parallel_size"
    require(deployment.enable_expert_parallel, field, dp,
            "DP > 1 is simulated for MoE models with enable_expert_parallel (ranks in lockstep); "
            "for independent replicas of a dense model use `servesim capacity` / simulate_cluster")
    require(deployment.tensor_parallel_size == 1, field, dp,
            f"DP > 1 is simulated with TP 1 per rank, not tensor_parallel_size="
            f"{deployment.tensor_parallel_size}")
    require(deployment.cost_model == "roofline", field, dp,
            "DP > 1 needs cost_model 'roofline' (the expert exchange is priced per operator)")
    require(speculative_config is None, field, dp, "DP > 1 with speculative decoding is not simulated")
    from kernels_cost_model import get_model
    model = get_model(deployment.model)
    require(model.is_moe, field, dp, f"{model.name} is not a mixture-of-experts model; DP + EP needs one")


def single_rank_only(deployment, what: str) -> None:
    """A named error where `what` (pipeline stages, KV offloading, cluster replicas) meets DP > 1."""
    dp = deployment.data_parallel_size
    require(dp == 1, "deployment.data_parallel_size", dp,
            f"{what} is simulated with one DP rank; drop one of the two")


def run_lockstep(engines: list[Engine], cost, workload, *, seed: int = 0, until: float | None = None,
                 progress=None) -> list:
    """Run `engines` as lockstep DP ranks serving `workload`; the RunRecords of every rank."""
    env = simpy.Environment()
    lockstep = LockstepDP(env, engines, cost)
    if progress is not None:
        for engine in engines:
            watch_finishes(env, engine, progress)
    start_workload(env, workload, lockstep.submit, seed)
    run_env(env, until)
    check_all_finished(engines, until)
    return [e.records(env.now) for e in engines]
