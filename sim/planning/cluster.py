"""Multi-replica clusters: N engine replicas (possibly of different GPUs) behind a router.

    from sim.planning.cluster import simulate_cluster
    out = simulate_cluster(config, replicas=4, router="prefix_affinity")
    out.results.summary["p99_ttft_ms"], [r.summary["prefix_cache_hit_rate"] for r in out.replicas]

One SimPy environment, one `EngineProcess` per replica; the workload submits to the router, which
forwards each request to the replica it picks. The engine is untouched: each replica keeps its own
records; the global Results concatenate the replicas' request and step tables.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd
import simpy

from sim.api.data_parallel import single_rank_only
from sim.api.cost_setup import build_cost_model
from sim.api.simulator import SimulationConfig, resolve_kv_groups, resolve_num_gpu_blocks
from sim.api.spec_setup import speculation_hooks
from sim.engine.engine import Engine
from kernels_cost_model.errors import require
from sim.api.results import Results, merge_results  # noqa: F401 - merge_results re-exported
from sim.planning.routers import make_router
from sim.core.fields import is_int
from sim.engine.simulation import (EngineProcess, check_all_finished, check_kv_capacity, check_traffic, check_until,
                                   run_env, start_workload)


@dataclass
class ClusterResults:
    """Global results (all requests; `replica` column) and one Results per replica."""

    results: Results
    replicas: list[Results]

    @property
    def summary(self) -> dict:
        return self.results.summary

    def per_replica(self) -> pd.DataFrame:
        """One row per replica: its summary metrics and request count."""
        return pd.DataFrame([dict(replica=i, **r.summary) for i, r in enumerate(self.replicas)])


class RoutedSubmit:
    """`submit(spec)` for the workload: pick a replica, count it outstanding until it finishes."""

    def __init__(self, router, procs: list[EngineProcess]):
        self.router, self.procs = router, procs

    def __call__(self, spec) -> simpy.Event:
        i = self.router.choose(spec)
        self.router.outstanding[i] += 1
        done = self.procs[i].submit(spec)
        done.callbacks.append(lambda _event, i=i: self._finished(i))
        return done

    def _finished(self, i: int) -> None:
        self.router.outstanding[i] -= 1


MAX_REPLICAS = 1024
"""Most replicas one simulation keeps engines for: each holds its own KV bookkeeping (a million, once
accepted, exhausted memory before the first step)."""


def replica_configs(config: SimulationConfig, replicas: int | list) -> list[SimulationConfig]:
    """One config per replica: `replicas` copies, or one per deployment (dict or DeploymentConfig)."""
    if is_int(replicas):
        require(replicas >= 1, "replicas", replicas, "must be an integer >= 1")
        require(replicas <= MAX_REPLICAS, "replicas", replicas, f"must be at most {MAX_REPLICAS} (one engine and KV"
                                                                " cache each, in one process)")
        return [config] * replicas
    require(isinstance(replicas, (list, tuple)), "replicas", replicas,
            "must be an integer >= 1 or a list of deployments (dicts or DeploymentConfig)")
    require(len(replicas) >= 1, "replicas", replicas, "must name at least one deployment")
    require(len(replicas) <= MAX_REPLICAS, "replicas", f"{len(replicas)} deployments",
            f"must be at most {MAX_REPLICAS} (one engine and KV cache each, in one process)")
    return [config.replace(deployment=d) for d in replicas]


def simulate_cluster(config: SimulationConfig, replicas: int | list = 1, router: str = "round_robin", *,
                     workload=None, until: float | None = None) -> ClusterResults:
    """Simulate `replicas` engines behind `router` serving config.workload (or `workload`)."""
    require(isinstance(config, SimulationConfig), "config", config,
            "must be a SimulationConfig (SimulationConfig.from_dict builds one from a dict)")
    check_traffic(workload)
    check_until(until)
    configs = replica_configs(config, replicas)
    env = simpy.Environment()
    engines = [_engine(c) for c in configs]
    procs = [EngineProcess(env, e) for e in engines]
    submit = RoutedSubmit(make_router(router, procs, config.engine.block_size), procs)
    traffic = workload if workload is not None else config.workload.build(
        config.engine.eos_token_id, config.engine.max_model_len)
    start_workload(env, traffic, submit, config.seed)
    run_env(env, until)
    check_all_finished(engines, until)
    slo = config.slo.as_dict()
    meta = {"config": dataclasses.asdict(config), "replicas": len(configs), "router": router}
    parts = [Results.from_records(e.records(env.now), slo=slo, meta=dict(meta, replica=i))
             for i, e in enumerate(engines)]
    return ClusterResults(merge_results(parts, slo, meta), parts)


def _engine(config: SimulationConfig) -> Engine:
    single_rank_only(config.deployment, "a cluster of replicas")
    blocks = check_kv_capacity(resolve_num_gpu_blocks(config), config.engine)
    return Engine(config.engine, build_cost_model(config.deployment, config.engine, config.speculative_config), blocks,
                  hooks=speculation_hooks(config), kv_groups=resolve_kv_groups(config))
