"""Capacity search over deployment topologies: aggregated or disaggregated (P:D ratios), CPU KV
offload on or off, TP x PP splits, ranked by cost per million tokens under the SLO.

    [search]                              # in plan.toml, beside [target] (docs/capacity.md)
    topologies = ["aggregated", "disaggregated"]
    tensor_parallel_sizes = [1, 2]
    pipeline_parallel_sizes = [1, 2]
    offload = [false, true]               # CPU KV tier of kv_offloading_size GiB per instance
    pd_ratios = ["1:1", "2:1"]            # prefill:decode instances of one disaggregated unit
    decode_tensor_parallel_sizes = [1]    # per pool (disaggregated only): prefill_/decode_ +
                                          # tensor_parallel_sizes, pipeline_parallel_sizes, offload

    report = search_topologies(Plan.from_toml("plan.toml"))

A *unit* is what one candidate scales by: one instance (TP x PP GPUs) when aggregated, P prefill
plus D decode instances when disaggregated. A per-pool key lets the pools of a disaggregated unit
differ in that setting (each pool's list defaults to the shared one); without one they share it. Per candidate: (1) a unit's max sustainable rate
(bisection, per seed, sim.planning.capacity); (2) units = ceil(target rate / the lowest seed's
capacity); (3) one unit at target rate / units must meet the target on every seed, else a unit is
added (up to 3 times, within max_replicas); (4) $/hour = units x GPUs per unit x $/GPU-hour, cost
per million output tokens = $/hour / (target rate x output tokens per request x 3600) x 1e6, and
goodput per GPU = a unit's capacity / its GPUs. Rows rank feasible first, cheapest per token first,
then most goodput per GPU.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import pandas as pd

from kernels_cost_model import make_cost_model
from kernels_cost_model.errors import ConfigError, require
from kernels_cost_model.links import get_link
from kernels_cost_model.pipeline import check_pipeline_size
from sim.api.simulator import SimulationConfig, simulate
from sim.planning.capacity import CapacityTarget, bracket_and_bisect, set_rate, summarize_seeds
from sim.planning.disagg import simulate_disaggregated
from sim.planning.disagg_config import DisaggConfig, PoolConfig
from sim.planning.executors import make_executor
from sim.planning.instances import InstanceShape, simulate_instance
from sim.planning.offload import OffloadConfig, check_offloading_size
from sim.planning.pipeline import PipelineConfig
from sim.planning.pricing import load_prices, price_per_gpu_hour

TOPOLOGIES = ("aggregated", "disaggregated")
POOL_AXES = {"tensor_parallel_sizes": "tensor_parallel_size", "pipeline_parallel_sizes": "pipeline_parallel_size",
             "offload": "offload"}       # [search] list -> Topology field, per pool as prefill_<key>, decode_<key>
POOL_KEYS = {f"{pool}_{key}" for pool in ("prefill", "decode") for key in POOL_AXES}
TOPOLOGY_KEYS = {"topologies", "pipeline_parallel_sizes", "offload", "pd_ratios", "kv_offloading_size",
                 "kv_offloading_link", "pipeline_link", "kv_transfer_link"} | POOL_KEYS
CONFIRM_ROUNDS = 3


@dataclass(frozen=True)
class Topology:
    """One candidate: GPU, TP x PP per instance, CPU tier, and (disaggregated) its P:D instances.
    Disaggregated, tensor_parallel_size, pipeline_parallel_size and offload are the prefill pool's,
    and the decode_ fields the decode pool's (None: as the prefill pool)."""

    gpu: str
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    offload: bool = False
    prefill: int = 0                # 0: aggregated
    decode: int = 0
    kv_offloading_size: float = 64.0
    kv_offloading_link: str = "pcie5"
    pipeline_link: str = "nvlink4"
    kv_transfer_link: str = "ib-ndr"
    decode_tensor_parallel_size: int | None = None
    decode_pipeline_parallel_size: int | None = None
    decode_offload: bool | None = None

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0

    def pool(self, name: str) -> tuple[int, int, bool]:
        """(TP, PP, offload) of the "prefill" (or aggregated) or "decode" instances."""
        own = (self.tensor_parallel_size, self.pipeline_parallel_size, self.offload)
        if name == "prefill":
            return own
        theirs = (self.decode_tensor_parallel_size, self.decode_pipeline_parallel_size, self.decode_offload)
        return tuple(o if d is None else d for o, d in zip(own, theirs))

    @property
    def gpus_per_unit(self) -> int:
        (tp, pp, _), (tp_d, pp_d, _) = self.pool("prefill"), self.pool("decode")
        return self.prefill * tp * pp + self.decode * tp_d * pp_d if self.disaggregated else tp * pp

    @property
    def label(self) -> str:
        if self.disaggregated and self.pool("prefill") != self.pool("decode"):
            return (f"{self.gpu} {self.prefill}P({_describe(*self.pool('prefill'))}):"
                    f"{self.decode}D({_describe(*self.pool('decode'))})")
        kind = f"{self.prefill}P:{self.decode}D" if self.disaggregated else "agg"
        pp = f" PP{self.pipeline_parallel_size}" if self.pipeline_parallel_size > 1 else ""
        return f"{self.gpu} TP{self.tensor_parallel_size}{pp} {kind}{' +cpu-kv' if self.offload else ''}"

    def config(self, base: SimulationConfig) -> SimulationConfig:
        """The shared config of the unit's instances (a CPU tier needs prefix caching)."""
        config = base.replace(deployment={"gpu": self.gpu, "tensor_parallel_size": self.tensor_parallel_size})
        offload = self.offload or (self.disaggregated and self.pool("decode")[2])
        return config.replace(engine={"enable_prefix_caching": True}) if offload else config

    def shape(self) -> InstanceShape:
        pipeline = PipelineConfig(self.pipeline_parallel_size, self.pipeline_link) \
            if self.pipeline_parallel_size > 1 else None
        offload = OffloadConfig(cpu_bytes=self.kv_offloading_size * 2**30, link=self.kv_offloading_link) \
            if self.offload else None
        return InstanceShape(pipeline, offload)

    def disagg(self) -> DisaggConfig:
        def pool(name: str, count: int) -> PoolConfig:
            tp, pp, offload = self.pool(name)
            return PoolConfig(count, tensor_parallel_size=tp if tp != self.tensor_parallel_size else None,
                              pipeline_parallel_size=pp, pipeline_link=self.pipeline_link,
                              kv_offloading_size=self.kv_offloading_size if offload else None,
                              kv_offloading_link=self.kv_offloading_link)
        return DisaggConfig(pool("prefill", self.prefill), pool("decode", self.decode), link=self.kv_transfer_link)

    def run(self, base: SimulationConfig) -> dict:
        """The summary of one unit serving base's traffic."""
        config = self.config(base)
        if self.disaggregated:
            return dict(simulate_disaggregated(config, self.disagg()).summary)
        if self.pipeline_parallel_size == 1 and not self.offload:
            return dict(simulate(config).summary)
        return dict(simulate_instance(config, self.shape()).summary)


def topologies(search: dict, base: SimulationConfig) -> tuple[Topology, ...]:
    """Every candidate of a [search] table: gpus x topologies (x pd_ratios) x TP x PP x offload."""
    kinds = _list(search, "topologies", ["aggregated"])
    for kind in kinds:
        require(kind in TOPOLOGIES, "search.topologies", kind, f"must be one of {TOPOLOGIES}")
    ratios = [_ratio(r) for r in _list(search, "pd_ratios", ["1:1"])]
    shared = {k: search[k] for k in ("kv_offloading_size", "kv_offloading_link", "pipeline_link",
                                     "kv_transfer_link") if k in search}
    _check_shared(shared)
    grid = itertools.product(_list(search, "gpus", [base.deployment.gpu]),
                             _list(search, "tensor_parallel_sizes", [base.deployment.tensor_parallel_size]),
                             _list(search, "pipeline_parallel_sizes", [1]), _list(search, "offload", [False]))
    out = []
    for gpu, tp, pp, offload in grid:
        require(isinstance(offload, bool), "search.offload", offload, "must be a list of true/false")
        with _named("search.pipeline_parallel_sizes"):
            check_pipeline_size(base.deployment.model, pp)
        shapes = [(0, 0)] * ("aggregated" in kinds) + ratios * ("disaggregated" in kinds)
        if POOL_KEYS & set(search):        # disaggregated candidates come from the per-pool grid below
            shapes = shapes[:1] if "aggregated" in kinds else []
        out += [_topology(base, gpu=gpu, tensor_parallel_size=tp, pipeline_parallel_size=pp, offload=offload,
                          prefill=p, decode=d, **shared) for p, d in shapes]
    if POOL_KEYS & set(search):
        key = sorted(POOL_KEYS & set(search))[0]
        require("disaggregated" in kinds, f"search.{key}", search[key],
                'sets a pool of disaggregated candidates: add "disaggregated" to search.topologies')
        out += _per_pool(search, base, ratios, shared)
    _check_speculation(base, out)
    return tuple(out)


def _check_speculation(base: SimulationConfig, candidates: list) -> None:
    """Speculative decoding is simulated on aggregated instances without PP: other candidates are plan errors."""
    spec = base.speculative_config
    for t in candidates if spec is not None else ():
        pp = max(t.pool("prefill")[1], t.pool("decode")[1])
        require(not t.disaggregated and pp == 1, "speculative_config.method", spec.method,
                f"not simulated with candidate {t.label!r} (disaggregated or pipeline_parallel_size > 1)")


def _per_pool(search: dict, base: SimulationConfig, ratios: list, shared: dict) -> list:
    """Disaggregated candidates whose pools differ: gpus x (prefill, decode) pairs of each per-pool
    axis (tied where neither pool has its own key) x P:D ratios."""
    defaults = {"tensor_parallel_sizes": [base.deployment.tensor_parallel_size], "pipeline_parallel_sizes": [1],
                "offload": [False]}
    pairs = {}
    for key, default in defaults.items():
        both = _list(search, key, default)
        if f"prefill_{key}" in search or f"decode_{key}" in search:
            own = {pool: _list(search, f"{pool}_{key}", both) for pool in ("prefill", "decode")}
            _check_axis(base, f"prefill_{key}", own["prefill"]), _check_axis(base, f"decode_{key}", own["decode"])
            pairs[key] = list(itertools.product(own["prefill"], own["decode"]))
        else:
            pairs[key] = [(v, v) for v in both]
    grid = itertools.product(_list(search, "gpus", [base.deployment.gpu]), pairs["tensor_parallel_sizes"],
                             pairs["pipeline_parallel_sizes"], pairs["offload"], ratios)
    return [_topology(base, gpu=gpu, tensor_parallel_size=tp[0], pipeline_parallel_size=pp[0], offload=off[0],
                      decode_tensor_parallel_size=tp[1], decode_pipeline_parallel_size=pp[1], decode_offload=off[1],
                      prefill=p, decode=d, **shared)
            for gpu, tp, pp, off, (p, d) in grid]


def _check_axis(base: SimulationConfig, key: str, values: list) -> None:
    """A per-pool list: sizes integers >= 1 (PP dividing the layers), offload true/false."""
    for v in values:
        if key.endswith("offload"):
            require(isinstance(v, bool), f"search.{key}", v, "must be a list of true/false")
            continue
        require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f"search.{key}", v,
                "must be a list of integers >= 1")
        if key.endswith("pipeline_parallel_sizes"):
            with _named(f"search.{key}"):
                check_pipeline_size(base.deployment.model, v)


def _describe(tp: int, pp: int, offload: bool) -> str:
    return f"TP{tp}" + (f" PP{pp}" if pp > 1 else "") + (" +cpu-kv" if offload else "")


def _check_shared(shared: dict) -> None:
    """The CPU tier's size and the links, each named by its [search] key."""
    check_offloading_size("search.kv_offloading_size", shared.get("kv_offloading_size", 1.0))
    for key in ("kv_offloading_link", "pipeline_link", "kv_transfer_link"):
        if key in shared:
            try:
                get_link(shared[key])
            except ConfigError as exc:
                raise ConfigError(f"search.{key}", shared[key], exc.reason) from None


def _topology(base: SimulationConfig, **fields) -> Topology:
    """A checked candidate: links, sizes, GPU name and that TP splits the model's heads."""
    with _named("search"):
        t = Topology(**fields)
        t.shape(), t.disagg() if t.disaggregated else None
    d = t.config(base).deployment
    try:
        for tp in {t.pool("prefill")[0], t.pool("decode")[0]}:
            make_cost_model(d.model, d.gpu, tp, calibration=None)
    except ConfigError as exc:
        raise ConfigError(f"search candidate {t.label!r}: {exc.field}", exc.value, exc.reason) from None
    return t


class _named:
    """Re-raise a ConfigError under a [search] key (`search.pipeline_parallel_sizes: ...`)."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, ConfigError) and not exc.field.startswith("search"):
            raise ConfigError(f"{self.name}.{exc.field}" if self.name == "search" else self.name,
                              exc.value, exc.reason) from None
        return False


def _list(search: dict, key: str, default: list) -> list:
    values = search.get(key, default)
    require(isinstance(values, list) and len(values) > 0, f"search.{key}", values, "must be a non-empty list")
    return values


def _ratio(value) -> tuple[int, int]:
    """"2:1" or [2, 1] -> (2, 1)."""
    parts = value.split(":") if isinstance(value, str) else value
    try:
        p, d = (int(x) for x in parts)
    except (TypeError, ValueError):
        raise ConfigError("search.pd_ratios", value, 'each must be "P:D", e.g. "2:1"') from None
    require(p >= 1 and d >= 1, "search.pd_ratios", value, "P and D must be >= 1")
    return p, d


# ----- the search ---------------------------------------------------------------------------------

def unit_run(task: dict) -> dict:
    """One unit at one rate (worker entry point)."""
    config = set_rate(SimulationConfig.from_dict(task["config"]), task["rate"])
    return task["topology"].run(config)


def unit_capacity(task: dict) -> dict:
    """One seed's bisection of a unit's max sustainable rate (worker entry point)."""
    config = SimulationConfig.from_dict(task["config"])
    target, topology, runs = CapacityTarget(**task["target"]), task["topology"], []

    def holds(rate: float) -> bool:
        summary = topology.run(set_rate(config, rate))
        runs.append(dict(rate=rate, seed=config.seed, holds=target.holds(summary), **summary))
        return runs[-1]["holds"]

    lo, hi = bracket_and_bisect(holds, task["start"], task["rel_tol"], 12)
    return {"seed": config.seed, "rate": lo, "fail_rate": hi, "runs": runs}


@dataclass
class TopologyReport:
    """Ranked table (one row per topology), each one's capacity, and rate-curve runs for plots."""

    table: pd.DataFrame
    capacities: dict
    curves: pd.DataFrame


def search_topologies(plan) -> TopologyReport:
    """Rank `plan.topologies` (a sim.planning.plan.Plan) by cost per million output tokens."""
    prices = load_prices(plan.prices_path, plan.prices)
    with make_executor(plan.executor, workers=plan.workers) as pool:
        caps = _capacities(plan, pool)
        confirmed = _confirm(plan, pool, caps)
        curves = _curves(plan, pool, caps)
    rows = [_row(plan, t, caps[t], confirmed[t], price_per_gpu_hour(prices, t.gpu)) for t in plan.topologies]
    table = pd.DataFrame(rows).sort_values(["feasible", "usd_per_million_output_tokens", "goodput_per_gpu"],
                                           ascending=[False, True, False], kind="stable")
    table.insert(0, "rank", range(1, len(table) + 1))
    return TopologyReport(table.reset_index(drop=True), {t.label: caps[t] for t in plan.topologies}, curves)


def _task(plan, t: Topology, seed: int, **extra) -> dict:
    return {"config": dataclasses.asdict(plan.base.replace(seed=seed)), "topology": t, **extra}


def _capacities(plan, pool) -> dict:
    tasks, owners, found = [], [], {t: [] for t in plan.topologies}
    target = dataclasses.asdict(plan.target)
    for t in plan.topologies:
        for seed in plan.seeds:
            tasks.append(_task(plan, t, seed, target=target, start=plan.target_rate, rel_tol=plan.rel_tol))
            owners.append(t)
    for i, result in pool.map_unordered(unit_capacity, tasks):
        found[owners[i]].append(result)
    return {t: summarize_seeds(sorted(r, key=lambda x: x["seed"])) for t, r in found.items()}


def _confirm(plan, pool, caps: dict) -> dict:
    """Per topology: units, the mean summary of one unit at target / units, whether every seed held."""
    state = {}
    for t, cap in caps.items():
        worst = float(cap.per_seed["rate"].min())
        units = max(1, math.ceil(plan.target_rate / worst - 1e-9)) if worst > 0 else None
        state[t] = {"units": units, "summary": None, "ok": False}
    pending = [t for t, s in state.items() if s["units"] is not None and s["units"] <= plan.max_replicas]
    for _ in range(CONFIRM_ROUNDS):
        if not pending:
            break
        tasks = [_task(plan, t, seed, rate=plan.target_rate / state[t]["units"]) for t in pending for seed in plan.seeds]
        results = {t: [] for t in pending}
        for i, summary in pool.map_unordered(unit_run, tasks):
            results[pending[i // len(plan.seeds)]].append(summary)
        retry = []
        for t in pending:
            ok = all(plan.target.holds(s) for s in results[t])
            state[t].update(summary=_mean(results[t]), ok=ok)
            if not ok and state[t]["units"] < plan.max_replicas:
                state[t]["units"] += 1
                retry.append(t)
        pending = retry
    return state


def _curves(plan, pool, caps: dict) -> pd.DataFrame:
    """One unit of each topology at fractions of its capacity (first seed), for the capacity plots."""
    bounds = plan.target.as_slo()
    base = plan.base.replace(slo={"ttft_s": None, "tpot_s": None, "e2e_s": None, **bounds}) if bounds else plan.base
    tasks, meta = [], []
    for t, cap in caps.items():
        for fraction in plan.curve_points if cap.rate > 0 else ():
            tasks.append({"config": dataclasses.asdict(base.replace(seed=plan.seeds[0])), "topology": t,
                          "rate": cap.rate * fraction})
            meta.append({"candidate": t.label, "rate": cap.rate * fraction, "fraction_of_capacity": fraction})
    rows = [dict(meta[i], holds=plan.target.holds(s), **s) for i, s in pool.map_unordered(unit_run, tasks)]
    return pd.DataFrame(rows).sort_values(["candidate", "rate"]).reset_index(drop=True) if rows else pd.DataFrame()


def _mean(summaries: list[dict]) -> dict:
    keys = [k for k, v in summaries[0].items() if isinstance(v, (int, float))]
    return {k: sum(s[k] for s in summaries) / len(summaries) for k in keys}


def _row(plan, t: Topology, cap, done: dict, price: float) -> dict:
    n, s = done["units"], done["summary"]
    feasible = bool(done["ok"]) and n is not None and n <= plan.max_replicas
    gpus = n * t.gpus_per_unit if n else None
    usd_h = gpus * price if gpus else math.nan
    out_per_req = s["total_output_tokens"] / s["completed"] if s and s["completed"] else math.nan
    tokens_per_req = out_per_req + (s["total_input_tokens"] / s["completed"] if s and s["completed"] else math.nan)
    per_million = 1e6 / (plan.target_rate * 3600)
    row = {"candidate": t.label, "topology": "disaggregated" if t.disaggregated else "aggregated", "gpu": t.gpu,
           "tensor_parallel_size": t.tensor_parallel_size, "pipeline_parallel_size": t.pipeline_parallel_size,
           "offload": t.offload, "pd_ratio": f"{t.prefill}:{t.decode}" if t.disaggregated else "",
           "decode_tensor_parallel_size": t.pool("decode")[0] if t.disaggregated else math.nan,
           "decode_pipeline_parallel_size": t.pool("decode")[1] if t.disaggregated else math.nan,
           "decode_offload": t.pool("decode")[2] if t.disaggregated else math.nan,
           "gpus_per_replica": t.gpus_per_unit, "replicas": n, "num_gpus": gpus, "usd_per_gpu_hour": price,
           "usd_per_hour": usd_h, "usd_per_million_output_tokens": usd_h * per_million / out_per_req,
           "usd_per_million_tokens": usd_h * per_million / tokens_per_req, "output_tokens_per_request": out_per_req,
           "goodput_per_gpu": cap.rate / t.gpus_per_unit, "capacity_per_replica": cap.rate,
           "capacity_low": cap.low, "capacity_high": cap.high, "capacity_seeds": len(cap.per_seed),
           "capacity_bounded": cap.bounded,
           "headroom": n * cap.rate / plan.target_rate if n else math.nan, "feasible": feasible}
    for key in ("p99_ttft_ms", "p99_tpot_ms", "slo_attainment", "output_throughput"):
        row[f"{key}_at_target"] = s[key] if s else math.nan
    return row
