"""A capacity plan: traffic, SLO target, candidate deployments and prices (plan.toml).

    plan = Plan.from_toml("examples/plan.toml")

The file is a simulation config ([engine], [deployment], [workload], [slo], seed: the traffic and the
shared settings) plus [target] (what "sustainable" means), [search] (candidates) and [prices]
($/GPU-hour overrides). Schema and example: docs/capacity.md, examples/plan.toml.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from kernels_cost_model import make_cost_model
from sim.api.simulator import SimulationConfig
from sim.planning.capacity import CapacityTarget
from sim.api.sections import read_toml
from kernels_cost_model.errors import ConfigError, require
from sim.core.fields import is_int, is_number
from sim.planning.executors import EXECUTORS
from sim.planning.routers import ROUTERS
from sim.planning.sweep import make_point
from sim.planning.topology import TOPOLOGY_KEYS, topologies as topology_candidates

SEARCH_KEYS = {"gpus", "tensor_parallel_sizes", "candidates", "engine", "max_replicas", "router", "seeds",
               "rel_tol", "executor", "workers", "curve_points"} | TOPOLOGY_KEYS
TARGET_KEYS = {"rate", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "min_attainment", "percentile"}
CANDIDATE_KEYS = {"gpu", "tensor_parallel_size", "tp"}
CANDIDATE_SHAPE = 'a table like { gpu = "h100", tensor_parallel_size = 1 }'


@dataclass(frozen=True)
class Candidate:
    """One deployment shape to price: GPU, tensor parallelism and engine flag overrides."""

    gpu: str
    tensor_parallel_size: int
    engine: tuple = ()

    @property
    def label(self) -> str:
        flags = "".join(f" {k}={v}" for k, v in self.engine)
        return f"{self.gpu} TP{self.tensor_parallel_size}{flags}"

    def config(self, base: SimulationConfig) -> SimulationConfig:
        overrides = {"deployment.gpu": self.gpu, "deployment.tensor_parallel_size": self.tensor_parallel_size}
        overrides.update({f"engine.{k}": v for k, v in self.engine})
        return make_point(base, overrides).config


@dataclass(frozen=True)
class Plan:
    """Everything `search_deployments` needs."""

    base: SimulationConfig
    target_rate: float
    target: CapacityTarget
    candidates: tuple[Candidate, ...]
    max_replicas: int = 16
    router: str = "least_outstanding"
    seeds: tuple[int, ...] = (0, 1)
    rel_tol: float = 0.05
    executor: str = "pool"
    workers: int | None = None
    curve_points: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.25)
    prices: dict = field(default_factory=dict)
    prices_path: str | None = None
    topologies: tuple = ()     # sim.planning.topology.Topology candidates; empty: aggregated candidates only

    def __post_init__(self) -> None:
        require(is_number(self.target_rate) and self.target_rate > 0, "target.rate", self.target_rate,
                "must be a finite number > 0")
        require(len(self.candidates) > 0, "search", self.candidates, "no candidate deployments")
        require(is_int(self.max_replicas) and self.max_replicas >= 1, "search.max_replicas",
                self.max_replicas, "must be an integer >= 1")
        require(self.router in ROUTERS, "search.router", self.router, f"must be one of {ROUTERS}")
        require(self.executor in EXECUTORS, "search.executor", self.executor, f"must be one of {EXECUTORS}")
        require(isinstance(self.seeds, (tuple, list)) and all(is_int(s) and s >= 0 for s in self.seeds),
                "search.seeds", self.seeds, "must be a list of integers >= 0")
        require(len(self.seeds) > 0, "search.seeds", self.seeds, "give at least one seed")
        require(len(set(self.seeds)) == len(self.seeds), "search.seeds", self.seeds,
                "repeats a seed (a repeated run narrows the interval without new information)")
        require(is_number(self.rel_tol) and 0 < self.rel_tol < 1, "search.rel_tol", self.rel_tol,
                "must be a number in (0, 1)")
        points = self.curve_points
        require(isinstance(points, (tuple, list)) and len(points) > 0 and all(is_number(f) and f > 0 for f in points),
                "search.curve_points", self.curve_points, "must be a non-empty list of fractions of capacity > 0")
        slo = self.base.slo
        require(self.target.min_attainment is None or any(
            getattr(slo, name) is not None for name in ("ttft_s", "tpot_s", "e2e_s")), "target.min_attainment",
            self.target.min_attainment, "is the fraction of requests meeting [slo]; set an [slo] bound (ttft_s,"
            " tpot_s or e2e_s), or it counts completed requests only")

    @classmethod
    def from_toml(cls, path: str | Path) -> "Plan":
        path = Path(path)
        data = read_toml(path)
        return cls.from_dict(data, root=path.parent)

    @classmethod
    def from_dict(cls, data: dict, root: Path | None = None) -> "Plan":
        data = dict(data)
        target, search = _table(data.pop("target", {}), "target"), _table(data.pop("search", {}), "search")
        prices = dict(_table(data.pop("prices", {}), "prices"))
        _known(target, TARGET_KEYS, "target")
        _known(search, SEARCH_KEYS, "search")
        base = SimulationConfig.from_dict(data)
        rate = target.pop("rate", base.workload.rate)
        path = prices.pop("path", None)
        require(path is None or isinstance(path, str), "prices.path", path, "must be the path of a CSV file")
        if path is not None and root is not None:
            path = str((root / path).resolve())
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in search.items()
                  if k not in {"gpus", "tensor_parallel_sizes", "candidates", "engine"} | TOPOLOGY_KEYS}
        shapes = topology_candidates(search, base) if TOPOLOGY_KEYS & set(search) else ()
        return cls(base, rate, _target(target), candidates(search, base), prices=prices,
                   prices_path=path, topologies=shapes, **kwargs)


def candidates(search: dict, base: SimulationConfig) -> tuple[Candidate, ...]:
    """Explicit [[search.candidates]] or gpus x tensor_parallel_sizes, each x the [search.engine] grid."""
    engine = _table(search.get("engine", {}), "search.engine")
    for key, values in engine.items():
        require(isinstance(values, list) and values, f"search.engine.{key}", values, "must be a non-empty list")
    flags = [tuple(zip(engine, combo)) for combo in itertools.product(*engine.values())] or [()]
    if "candidates" in search:
        listed = search["candidates"]
        require(isinstance(listed, list), "search.candidates", listed, f"must be a list, each {CANDIDATE_SHAPE}")
        shapes = [_shape(c) for c in listed]
    else:
        gpus = search.get("gpus", [base.deployment.gpu])
        tps = search.get("tensor_parallel_sizes", [base.deployment.tensor_parallel_size])
        require(isinstance(gpus, list) and gpus, "search.gpus", gpus, "must be a non-empty list")
        require(isinstance(tps, list) and tps, "search.tensor_parallel_sizes", tps, "must be a non-empty list")
        shapes = list(itertools.product(gpus, tps))
    out = tuple(Candidate(g, tp, f) for g, tp in shapes for f in flags)
    for c in out:
        _check_candidate(c, base)
    return out


def _shape(candidate) -> tuple:
    """(gpu, tensor_parallel_size) of one [[search.candidates]] entry."""
    require(isinstance(candidate, dict), "search.candidates", candidate, f"each candidate must be {CANDIDATE_SHAPE}")
    _known(candidate, CANDIDATE_KEYS, "search.candidates")
    return candidate.get("gpu"), candidate.get("tensor_parallel_size", candidate.get("tp", 1))


def _target(target: dict) -> CapacityTarget:
    """The [target] bounds; a bad one is named as the plan's field (target.ttft_p99_s)."""
    try:
        return CapacityTarget(**target)
    except ConfigError as exc:
        name = exc.field if exc.field.startswith("target") else f"target.{exc.field}"
        raise ConfigError(name, exc.value, exc.reason) from None


def _check_candidate(c: Candidate, base: SimulationConfig) -> None:
    """GPU name, TP and engine flags now, and that the model can be split `tensor_parallel_size`
    ways (heads divide): an impossible shape is a plan error naming the candidate, not an
    infeasible row. Whether it fits in memory is the search's question."""
    try:  # the config's checks (the engine's block size reads the TP; other fields keep their own names)
        d = c.config(base).deployment
    except ConfigError as exc:
        if exc.field != "deployment.tensor_parallel_size":
            raise
        raise ConfigError(f"search candidate {c.label!r}: {exc.field}", exc.value, exc.reason) from None
    try:  # the roofline's shape checks, whichever cost model prices the steps
        make_cost_model(d.model, d.gpu, d.tensor_parallel_size, calibration=None)
    except ConfigError as exc:
        raise ConfigError(f"search candidate {c.label!r}: {exc.field}", exc.value, exc.reason) from None


def _table(value, name: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(name, value, "must be a table")
    return dict(value)


def _known(values: dict, known: set, name: str) -> None:
    for key in values:
        if key not in known:
            raise ConfigError(f"{name}.{key}", values[key], f"unknown setting; known: {sorted(known)}")
