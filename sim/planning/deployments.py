"""Deployment search: rank GPU x TP x replicas x engine flags by cost for a traffic and an SLO.

    report = search_deployments(Plan.from_toml("examples/plan.toml"))
    print(report.table)

Per candidate: (1) the max sustainable rate of one replica (bisection, several seeds, see
sim.planning.capacity); (2) replicas = ceil(target rate / the lowest seed's capacity); (3) a cluster run at the
target rate per seed (traffic scaled so each replica sees the plan's num_requests) confirms the target,
adding a replica while it fails; (4) cost = replicas x TP x $/GPU-hour; cost per million output tokens
from the confirmed run's output throughput; headroom = replicas x capacity / target rate.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pandas as pd

from sim.planning.capacity import CapacityResult, search_seed, seed_task, summarize_seeds
from kernels_cost_model.errors import ConfigError
from sim.planning.executors import make_executor
from sim.planning.plan import Candidate, Plan
from sim.planning.pricing import load_prices, price_per_gpu_hour
from sim.planning.sweep import run_task

MAX_CONFIRM_ROUNDS = 3


@dataclass
class DeploymentReport:
    """Ranked table (one row per candidate), each candidate's capacity, and rate-curve runs for plots."""

    table: pd.DataFrame
    capacities: dict
    curves: pd.DataFrame


def search_deployments(plan: Plan) -> DeploymentReport:
    """Rank the plan's candidates by $/hour, then headroom (infeasible ones last)."""
    prices = load_prices(plan.prices_path, plan.prices)
    hourly = {c: price_per_gpu_hour(prices, c.gpu) for c in plan.candidates}
    with make_executor(plan.executor, workers=plan.workers) as pool:
        caps = single_replica_capacity(plan, pool)
        replicas = {c: _replicas_needed(plan.target_rate, caps[c]) for c in plan.candidates}
        confirmed = confirm(plan, pool, replicas)
        curves = rate_curves(plan, pool, caps)
    rows = [_row(plan, c, caps[c], confirmed[c], hourly[c]) for c in plan.candidates]
    table = pd.DataFrame(rows).sort_values(["feasible", "usd_per_hour", "headroom"],
                                          ascending=[False, True, False], kind="stable")
    table.insert(0, "rank", range(1, len(table) + 1))
    return DeploymentReport(table.reset_index(drop=True), {c.label: caps[c] for c in plan.candidates}, curves)


def single_replica_capacity(plan: Plan, pool) -> dict[Candidate, CapacityResult | None]:
    """Each candidate's one-replica capacity; None where the model does not fit the GPUs."""
    tasks, owners, caps = [], [], {}
    for c in plan.candidates:
        try:
            config = c.config(plan.base)
            _check_fits(config)
        except ConfigError:
            caps[c] = None
            continue
        for seed in plan.seeds:
            tasks.append(seed_task(config, plan.target, seed, 1, plan.router, None, plan.target_rate,
                                   plan.rel_tol, 12))
            owners.append(c)
    results: dict = {c: [] for c in plan.candidates}
    for i, result in pool.map_unordered(search_seed, tasks):
        results[owners[i]].append(result)
    for c, found in results.items():
        if found:
            caps[c] = summarize_seeds(sorted(found, key=lambda r: r["seed"]))
    return caps


def _check_fits(config) -> None:
    from sim.api.simulator import resolve_num_gpu_blocks
    resolve_num_gpu_blocks(config)


def _replicas_needed(target_rate: float, cap: CapacityResult | None) -> int | None:
    worst = cap.per_seed["rate"].min() if cap is not None else 0.0
    if worst <= 0:
        return None
    return max(1, math.ceil(target_rate / worst - 1e-9))


def confirm(plan: Plan, pool, replicas: dict) -> dict[Candidate, dict]:
    """Cluster runs at the target rate; a replica is added (up to max_replicas) while the target fails."""
    state = {c: {"replicas": n, "summary": None, "ok": False} for c, n in replicas.items()}
    pending = [c for c, n in replicas.items() if n is not None and n <= plan.max_replicas]
    for _ in range(MAX_CONFIRM_ROUNDS):
        if not pending:
            break
        runs = _cluster_runs(plan, pool, {c: state[c]["replicas"] for c in pending})
        retry = []
        for c in pending:
            summaries = runs[c]
            ok = all(plan.target.holds(s) for s in summaries)
            state[c].update(summary=_mean(summaries), ok=ok)
            if not ok and state[c]["replicas"] < plan.max_replicas:
                state[c]["replicas"] += 1
                retry.append(c)
        pending = retry
    return state


def _cluster_runs(plan: Plan, pool, replicas: dict) -> dict[Candidate, list[dict]]:
    tasks, owners = [], []
    for c, n in replicas.items():
        config = c.config(plan.base).replace(workload={"num_requests": plan.base.workload.num_requests * n})
        config = _at_rate(config, plan.target_rate)
        for seed in plan.seeds:
            tasks.append({"config": dataclasses.asdict(config.replace(seed=seed)), "replicas": n,
                          "router": plan.router})
            owners.append(c)
    out: dict = {c: [] for c in replicas}
    for i, summary in pool.map_unordered(run_task, tasks):
        out[owners[i]].append(summary)
    return out


def _at_rate(config, rate: float):
    from sim.planning.capacity import set_rate
    return set_rate(config, rate)


def _mean(summaries: list[dict]) -> dict:
    keys = [k for k, v in summaries[0].items() if isinstance(v, (int, float))]
    return {k: sum(s[k] for s in summaries) / len(summaries) for k in keys}


def rate_curves(plan: Plan, pool, caps: dict) -> pd.DataFrame:
    """One replica of each candidate at fractions of its capacity (first seed): latency/attainment curves.

    The runs' SLO is the target's bounds, so their slo_attainment is the fraction of requests within them."""
    tasks, meta = [], []
    bounds = plan.target.as_slo()
    slo = {"ttft_s": None, "tpot_s": None, "e2e_s": None, **bounds} if bounds else {}
    for c, cap in caps.items():
        if cap is None or cap.rate <= 0:
            continue
        for fraction in plan.curve_points:
            rate = cap.rate * fraction
            config = _at_rate(c.config(plan.base), rate).replace(seed=plan.seeds[0], **({"slo": slo} if slo else {}))
            tasks.append({"config": dataclasses.asdict(config), "replicas": 1, "router": plan.router})
            meta.append({"candidate": c.label, "rate": rate, "fraction_of_capacity": fraction})
    rows = [dict(meta[i], holds=plan.target.holds(s), **s) for i, s in pool.map_unordered(run_task, tasks)]
    return pd.DataFrame(rows).sort_values(["candidate", "rate"]).reset_index(drop=True) if rows else pd.DataFrame()


def _row(plan: Plan, c: Candidate, cap: CapacityResult | None, done: dict, price: float) -> dict:
    n, s = done["replicas"], done["summary"]
    feasible = bool(done["ok"]) and n is not None and n <= plan.max_replicas
    gpus = n * c.tensor_parallel_size if n else None
    usd_h = gpus * price if gpus else math.nan
    out_tps = s["output_throughput"] if s else math.nan
    row = {"candidate": c.label, "gpu": c.gpu, "tensor_parallel_size": c.tensor_parallel_size,
           **dict(c.engine), "replicas": n, "num_gpus": gpus, "usd_per_gpu_hour": price, "usd_per_hour": usd_h,
           "usd_per_million_output_tokens": usd_h / (out_tps * 3600) * 1e6 if s and out_tps > 0 else math.nan,
           "capacity_per_replica": cap.rate if cap else 0.0, "capacity_low": cap.low if cap else 0.0,
           "capacity_high": cap.high if cap else 0.0, "capacity_seeds": len(cap.per_seed) if cap else 0,
           "capacity_bounded": cap.bounded if cap else True,
           "headroom": n * cap.rate / plan.target_rate if cap and n else math.nan, "feasible": feasible}
    for key in ("p99_ttft_ms", "p99_tpot_ms", "slo_attainment", "output_throughput"):
        row[f"{key}_at_target"] = s[key] if s else math.nan
    return row
