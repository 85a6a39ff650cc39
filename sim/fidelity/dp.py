"""Data-parallel replay: DP engine replicas in one SimPy environment, stepping in lockstep.

vLLM (0.19) runs one engine core per DP rank. With a MoE model the ranks' forward passes are
collective (expert parallelism), so all ranks step together; a rank without work runs a dummy batch.
New requests go to the least-loaded rank by vLLM's DP load-balancing score, 4 x waiting + running
(`DPLBAsyncMPClient`), lowest rank on ties.
"""
from __future__ import annotations

import pandas as pd
import simpy

from sim.api.simulator import SimulationConfig, build_cost_model
from sim.engine.engine import Engine
from sim.api.metrics import add_latency_columns
from kernels_cost_model.expert_parallel import ExpertParallelCostModel, ep_kv_cache_blocks

from .tables import Replay, request_table, step_table


def lb_score(engine: Engine) -> int:
    return 4 * len(engine.state.waiting) + len(engine.state.running)


class LockstepDP:
    """DP ranks under one loop: plan every rank, price the step jointly, finish every rank."""

    def __init__(self, env: simpy.Environment, engines: list[Engine], cost: ExpertParallelCostModel):
        self.env, self.engines, self.cost = env, engines, cost
        self.wakeup: simpy.Event | None = None
        env.process(self.loop())

    def submit(self, spec) -> None:
        rank = min(range(len(self.engines)), key=lambda i: (lb_score(self.engines[i]), i))
        self.engines[rank].add_request(spec, self.env.now)
        if self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()

    def loop(self):
        env = self.env
        while True:
            steps = [e.plan_step(env.now) if e.has_work else None for e in self.engines]
            if all(s is None for s in steps):
                self.wakeup = env.event()
                yield self.wakeup
                self.wakeup = None
                continue
            duration = self.cost.step_time([s.batch if s else None for s in steps])
            for s in steps:
                if s is not None:
                    s.duration = duration
            yield env.timeout(duration)
            for engine, s in zip(self.engines, steps):
                if s is not None:
                    engine.finish_step(s, env.now)


def replay_data_parallel(config: SimulationConfig, specs: list, dp: int, expert_parallel: bool) -> Replay:
    """Simulate `dp` lockstep ranks (TP 1 each) serving `specs`."""
    if not expert_parallel:
        raise NotImplementedError("DP without expert parallelism: simulate each rank on its own")
    d, e = config.deployment, config.engine
    cost = ExpertParallelCostModel(build_cost_model(d, e), dp)
    blocks = ep_kv_cache_blocks(d.model, d.gpu, dp, e.block_size, d.gpu_memory_utilization,
                                e.max_num_batched_tokens)
    env = simpy.Environment()
    engines = [Engine(e, cost.base, blocks) for _ in range(dp)]
    lockstep = LockstepDP(env, engines, cost)
    env.process(_arrivals(env, specs, lockstep.submit))
    env.run()
    records = [eng.records(env.now) for eng in engines]
    requests = pd.concat([request_table(add_latency_columns(pd.DataFrame(r.requests.columns())))
                          for r in records], ignore_index=True)
    return Replay(requests, _merge_steps(records), blocks)


def _arrivals(env, specs, submit):
    for spec in specs:
        yield env.timeout(max(0.0, spec.arrival_time_s - env.now))
        submit(spec)


def _merge_steps(records) -> pd.DataFrame:
    """Per-step tables of the ranks summed: at each step end, every rank's latest queue lengths."""
    tables = [step_table(pd.DataFrame(r.steps.columns())) for r in records]
    ends = sorted(set().union(*(t["end_s"] for t in tables)))
    merged = pd.DataFrame({"end_s": ends})
    for col in ("num_running", "num_waiting", "num_prefill_tokens", "num_decode_tokens"):
        merged[col] = 0
    for t in tables:
        aligned = t.set_index("end_s").reindex(ends)
        for col in ("num_running", "num_waiting"):
            merged[col] += aligned[col].ffill().fillna(0).to_numpy(int)
        for col in ("num_prefill_tokens", "num_decode_tokens"):
            merged[col] += aligned[col].fillna(0).to_numpy(int)
    merged["duration_s"] = merged["end_s"].diff().fillna(merged["end_s"].iloc[0])
    return merged
