"""Max sustainable rate under an SLO: bracketing and bisection over arrival rates, several seeds.

    from sim.planning.capacity import CapacityTarget, max_sustainable_rate
    target = CapacityTarget(ttft_p99_s=1.0, tpot_p99_s=0.05)
    cap = max_sustainable_rate(config, target, seeds=[0, 1, 2])
    print(cap)        # "12.4 req/s ± 0.6 (95% CI over 3 seeds) ..."

Each seed is searched on its own: from the config's rate, double (or halve) until the target
fails (holds), then bisect until the bracket is within `rel_tol`. A seed's answer is the highest
rate seen to hold. The result reports the mean over seeds and a t-interval, not one lucky run.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from sim.api.metrics import latency_key
from sim.api.simulator import SimulationConfig, simulate
from kernels_cost_model.errors import require
from sim.core.fields import is_int, is_number
from sim.planning.executors import make_executor
from sim.planning.routers import ROUTERS

MAX_BISECTIONS = 60
"""Hard stop for bisection: 2**-60 of a bracket is finer than any tolerance a float rate can honour."""
MAX_BRACKET_STEPS = 60
"""Most doublings (or halvings) of the start rate while bracketing: 2**60 spans any rate worth trying."""

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


@dataclass(frozen=True)
class CapacityTarget:
    """What must hold at a rate: percentile bounds (seconds) and/or a minimum SLO attainment.

    min_attainment: fraction of requests meeting config.slo (goodput / request rate), e.g. 0.9.
    Every admitted request must also complete (prompts over max_model_len are rejected whatever the
    load, so they do not count against a rate).
    """

    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    e2e_p99_s: float | None = None
    min_attainment: float | None = None
    percentile: int = 99

    def __post_init__(self) -> None:
        require(self.percentile in (50, 90, 99), "percentile", self.percentile, "must be 50, 90 or 99")
        for name in ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s"):
            value = getattr(self, name)
            require(value is None or (is_number(value) and value > 0), name, value, "must be a number > 0 or None")
        require(self.min_attainment is None or (is_number(self.min_attainment) and 0 < self.min_attainment <= 1),
                "min_attainment", self.min_attainment, "must be in (0, 1]")
        require(any(getattr(self, f.name) is not None for f in dataclasses.fields(self) if f.name != "percentile"),
                "target", {}, "give at least one bound: ttft_p99_s, tpot_p99_s, e2e_p99_s or min_attainment")

    def as_slo(self) -> dict:
        """The bounds as a per-request SLO ({"ttft_s": ..., ...}): a p99 bound holds while at least
        99 % of requests are within it, so attainment against this SLO shows how close a rate is."""
        pairs = (("ttft_s", self.ttft_p99_s), ("tpot_s", self.tpot_p99_s), ("e2e_s", self.e2e_p99_s))
        return {name: value for name, value in pairs if value is not None}

    def holds(self, summary: dict) -> bool:
        """Whether a run's summary meets every bound."""
        p = self.percentile
        checks = [(bound, summary[latency_key(metric, p)] / 1e3) for bound, metric in
                  ((self.ttft_p99_s, "ttft"), (self.tpot_p99_s, "tpot"), (self.e2e_p99_s, "e2el"))]
        ok = all(bound is None or (value == value and value <= bound) for bound, value in checks)
        if self.min_attainment is not None:
            ok &= summary["slo_attainment"] >= self.min_attainment
        return ok and summary["completed"] == summary["num_requests"] - summary["num_rejected"]


@dataclass
class CapacityResult:
    """The search's answer: mean rate over seeds, its 95% interval, per-seed brackets, every run."""

    rate: float
    low: float
    high: float
    per_seed: pd.DataFrame
    evaluations: pd.DataFrame

    @property
    def bounded(self) -> bool:
        """Whether every seed's search found a rate at which the target fails: else its answer is only
        the highest rate it tried (doubling `max_steps` times), a lower bound of the capacity."""
        return all(math.isfinite(rate) for rate in self.per_seed["fail_rate"])

    def __str__(self) -> str:
        n = len(self.per_seed)
        text = (f"{self.rate:.4g} req/s ± {(self.high - self.low) / 2:.2g} (95% CI over {n} seed"
                f"{'s' if n > 1 else ''}; per-seed range {self.per_seed['rate'].min():.4g}"
                f"-{self.per_seed['rate'].max():.4g})")
        return text if self.bounded else f"at least {text}: the target held at every rate tried"


def set_rate(config: SimulationConfig, rate: float) -> SimulationConfig:
    """The config with its arrival rate set (trace workloads: their target_rate)."""
    require(is_number(rate) and rate > 0, "workload.rate", rate, "must be a number > 0")
    kind = config.workload.kind
    require(kind != "closed_loop", "workload.kind", kind, "a rate search needs an open-loop workload")
    key = "target_rate" if kind == "trace" else "rate"
    return config.replace(workload={key: float(rate)})


def evaluate(config: SimulationConfig, rate: float, replicas: int = 1, router: str = "round_robin",
             workload=None) -> dict:
    """Summary of one run at `rate`; `workload(rate)` (if given) builds the traffic."""
    config = set_rate(config, rate)
    traffic = workload(rate) if workload is not None else None
    if replicas == 1:
        return simulate(config, workload=traffic).summary
    from sim.planning.cluster import simulate_cluster
    return simulate_cluster(config, replicas, router, workload=traffic).summary


def bracket_and_bisect(holds, start: float, rel_tol: float = 0.02, max_steps: int = 12) -> tuple[float, float]:
    """(lo, hi): lo the highest rate seen to hold (0 if none), hi the lowest seen to fail (inf if none)."""
    lo, hi = bracket(holds, start, max_steps)
    for _ in range(MAX_BISECTIONS):
        if not (lo > 0 and hi < math.inf and hi - lo > rel_tol * hi):
            break
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo, hi


def bracket(holds, start: float, max_steps: int) -> tuple[float, float]:
    """Double from `start` while the target holds, or halve while it fails: (holds at, fails at)."""
    up = holds(start)
    good, bad = (start, math.inf) if up else (0.0, start)
    rate = start
    for _ in range(max_steps):
        rate = rate * 2 if up else rate / 2
        if holds(rate) != up:
            return (good, rate) if up else (rate, bad)
        good, bad = (rate, bad) if up else (good, rate)
    return good, bad


def search_seed(task: dict) -> dict:
    """One seed's search (worker entry point): its bracket and every run it made."""
    config = SimulationConfig.from_dict(task["config"])
    target = CapacityTarget(**task["target"])
    runs = []

    def holds(rate: float) -> bool:
        summary = evaluate(config, rate, task["replicas"], task["router"], task["workload"])
        runs.append(dict(rate=rate, seed=config.seed, holds=target.holds(summary), **summary))
        return runs[-1]["holds"]

    lo, hi = bracket_and_bisect(holds, task["start"], task["rel_tol"], task["max_steps"])
    return {"seed": config.seed, "rate": lo, "fail_rate": hi, "runs": runs}


def max_sustainable_rate(config: SimulationConfig, target: CapacityTarget, seeds=(0, 1, 2), *,
                         replicas: int = 1, router: str = "round_robin", workload=None,
                         start_rate: float | None = None, rel_tol: float = 0.02, max_steps: int = 12,
                         executor: str = "serial", workers: int | None = None) -> CapacityResult:
    """The highest arrival rate at which `target` holds, searched per seed, with its spread.

    workload: optional picklable `rate -> workload` (e.g. constant-rate arrivals); default config.workload.
    executor: run the seeds' searches "serial"ly, on a "pool" or on "ray".
    """
    seeds = _seed_list(seeds)
    require(is_number(rel_tol) and 0 < rel_tol < 1, "rel_tol", rel_tol, "must be a number in (0, 1)")
    _check_search(config, target, replicas, router, workload, start_rate, max_steps)
    start = start_rate if start_rate is not None else (config.workload.target_rate or config.workload.rate)
    set_rate(config, start)
    tasks = [seed_task(config, target, s, replicas, router, workload, start, rel_tol, max_steps) for s in seeds]
    with make_executor(executor, workers=workers) as pool:
        results = sorted((r for _, r in pool.map_unordered(search_seed, tasks)), key=lambda r: r["seed"])
    return summarize_seeds(results)


def _seed_list(seeds) -> list:
    """The seeds as a list: at least one, none repeated (the interval treats them as independent runs)."""
    require(isinstance(seeds, Iterable) and not isinstance(seeds, (str, bytes, dict)), "seeds", seeds,
            "must be a list of integers >= 0, e.g. [0, 1, 2]")
    seeds = list(seeds)
    require(len(seeds) > 0, "seeds", seeds, "give at least one seed")
    require(len(set(seeds)) == len(seeds), "seeds", seeds, "repeats a seed; give distinct seeds")
    return seeds


def _check_search(config, target, replicas, router, workload, start_rate, max_steps) -> None:
    """max_sustainable_rate's other arguments, named before any run."""
    from sim.planning.cluster import replica_configs
    require(isinstance(config, SimulationConfig), "config", config,
            "must be a SimulationConfig (SimulationConfig.from_dict builds one from a dict)")
    require(isinstance(target, CapacityTarget), "target", target,
            "must be a CapacityTarget, e.g. CapacityTarget(ttft_p99_s=1.0)")
    replica_configs(config, replicas)
    require(router in ROUTERS, "router", router, f"must be one of {ROUTERS}")
    require(workload is None or callable(workload), "workload", workload,
            "must be None or a picklable function rate -> workload")
    require(start_rate is None or (is_number(start_rate) and start_rate > 0), "start_rate", start_rate,
            "must be None (the config's rate) or a number > 0")
    require(is_int(max_steps) and 1 <= max_steps <= MAX_BRACKET_STEPS, "max_steps", max_steps,
            f"must be an integer in [1, {MAX_BRACKET_STEPS}]")


def seed_task(config, target, seed, replicas, router, workload, start, rel_tol, max_steps) -> dict:
    """The plain-data task of one seed's search."""
    return {"config": dataclasses.asdict(config.replace(seed=seed)), "target": dataclasses.asdict(target),
            "replicas": replicas, "router": router, "workload": workload, "start": start,
            "rel_tol": rel_tol, "max_steps": max_steps}


def summarize_seeds(results: list[dict]) -> CapacityResult:
    """Mean of the seeds' answers and a Student-t 95% interval (zero width for one seed)."""
    per_seed = pd.DataFrame([{k: r[k] for k in ("seed", "rate", "fail_rate")} for r in results])
    runs = pd.DataFrame([run for r in results for run in r["runs"]])
    rates = per_seed["rate"].to_numpy(dtype=float)
    mean = float(rates.mean())
    half = T95.get(len(rates) - 1, 1.96) * float(rates.std(ddof=1)) / math.sqrt(len(rates)) if len(rates) > 1 else 0.0
    return CapacityResult(mean, max(0.0, mean - half), mean + half, per_seed, runs)


def attainment_curve(evaluations: pd.DataFrame) -> pd.DataFrame:
    """Per rate: fraction of seeds meeting the target and mean metrics (for plots)."""
    cols = ["holds", "slo_attainment", "p99_ttft_ms", "p99_tpot_ms", "request_throughput"]
    return evaluations.groupby("rate", as_index=False)[cols].mean().sort_values("rate")


__all__ = ["CapacityResult", "CapacityTarget", "attainment_curve", "bracket_and_bisect", "evaluate",
           "max_sustainable_rate", "set_rate"]
