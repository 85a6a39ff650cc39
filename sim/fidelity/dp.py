"""Data-parallel replay: DP engine replicas in one SimPy environment, stepping in lockstep.

The lockstep loop and vLLM's DP load balancing live in sim.api.data_parallel (shared with `simulate()`);
this module replays a measured run's requests through them and tabulates the ranks as one.
"""
from __future__ import annotations

import pandas as pd
import simpy

from sim.api.data_parallel import LockstepDP
from sim.api.cost_setup import build_cost_model
from sim.api.simulator import SimulationConfig
from sim.engine.engine import Engine
from sim.engine.simulation import run_env
from sim.api.metrics import add_latency_columns
from kernels_cost_model.expert_parallel import ExpertParallelCostModel, ep_kv_cache_blocks

from .tables import Replay, request_table, step_table


def replay_data_parallel(config: SimulationConfig, specs: list, dp: int, expert_parallel: bool,
                         cost_model=None) -> Replay:
    """Simulate `dp` lockstep ranks (TP 1 each) serving `specs`; `cost_model`: one rank's step-time
    model (default: the deployment's)."""
    if not expert_parallel:
        raise NotImplementedError("DP without expert parallelism: simulate each rank on its own")
    d, e = config.deployment, config.engine
    cost = ExpertParallelCostModel(cost_model or build_cost_model(d, e), dp)
    blocks = e.num_gpu_blocks or ep_kv_cache_blocks(d.model, d.gpu, dp, e.block_size, d.gpu_memory_utilization,
                                                    e.max_num_batched_tokens)
    env = simpy.Environment()
    engines = [Engine(e, cost.base, blocks) for _ in range(dp)]
    lockstep = LockstepDP(env, engines, cost)
    env.process(_arrivals(env, specs, lockstep.submit))
    run_env(env)
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
