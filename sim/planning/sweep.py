"""Sweeps: a grid (or list) of configs x seeds, run in parallel, one DataFrame row per (config, seed).

    from sim.planning.sweep import grid, run_sweep
    points = grid(base, {"workload.rate": [5, 10, 20], "engine.max_num_seqs": [64, 256], "replicas": [1, 2]})
    df = run_sweep(points, seeds=[0, 1, 2], executor="pool", out_dir="sweep-out")

Axis names are dotted config fields ("workload.rate", "deployment.gpu", "engine.enable_chunked_prefill")
or a short alias (rate, gpu, tp, max_num_seqs, ...), plus "replicas" and "router" for clusters.
Each finished (config, seed) is saved as out_dir/results/<key>.json, key = sha256 of the canonical JSON
of the full config with its seed, replicas and router, so an interrupted sweep rerun reuses them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.api.table_io import write_text
from sim.api.sections import SECTIONS
from sim.api.simulator import SimulationConfig, simulate
from sim.core.speculative import SpeculativeConfig
from kernels_cost_model.errors import ConfigError, require
from sim.core.fields import is_int
from sim.planning.executors import make_executor
from sim.api.progress import Progress
from sim.planning.routers import ROUTERS

ALIASES = {
    "rate": "workload.rate", "num_requests": "workload.num_requests", "gpu": "deployment.gpu",
    "model": "deployment.model", "tp": "deployment.tensor_parallel_size",
    "tensor_parallel_size": "deployment.tensor_parallel_size", "max_num_seqs": "engine.max_num_seqs",
    "max_num_batched_tokens": "engine.max_num_batched_tokens",
    "enable_chunked_prefill": "engine.enable_chunked_prefill", "chunked_prefill": "engine.enable_chunked_prefill",
    "policy": "engine.policy", "enable_prefix_caching": "engine.enable_prefix_caching",
    "prefix_caching": "engine.enable_prefix_caching",
}
CLUSTER_AXES = ("replicas", "router")


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of a sweep: the full config, its cluster shape and the axis values set."""

    config: SimulationConfig
    replicas: int = 1
    router: str = "round_robin"
    params: tuple = ()

    def task(self, seed: int) -> dict:
        """The picklable description a worker runs (plain data, seed included)."""
        config = dataclasses.asdict(self.config.replace(seed=seed))
        return {"config": config, "replicas": self.replicas, "router": self.router}

    def key(self, seed: int) -> str:
        """Stable id of (config, seed): sha256 of canonical JSON."""
        text = json.dumps(self.task(seed), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def canonical_axis(name: str) -> str:
    """The dotted field an axis name means; ConfigError for unknown names."""
    name = ALIASES.get(name, name)
    if name in CLUSTER_AXES:
        return name
    section, _, key = name.partition(".")
    sections = dict(SECTIONS, speculative_config=SpeculativeConfig)
    require(section in sections and key, "sweep", name,
            f"unknown axis; use section.field, one of {sorted(ALIASES)} or {CLUSTER_AXES}")
    known = {f.name for f in dataclasses.fields(sections[section])}
    require(key in known, f"sweep.{name}", key, f"unknown field of [{section}]; known: {sorted(known)}")
    return name


def make_point(base: SimulationConfig, overrides: dict) -> SweepPoint:
    """Apply {axis: value} to `base`; bad values raise ConfigError naming the axis and value."""
    sections: dict[str, dict] = {}
    cluster = {"replicas": 1, "router": "round_robin"}
    params = []
    for axis, value in overrides.items():
        name = canonical_axis(axis)
        params.append((name, value))
        if name in CLUSTER_AXES:
            cluster[name] = value
            continue
        section, _, key = name.partition(".")
        sections.setdefault(section, {})[key] = value
    _check_cluster(cluster)
    try:
        config = base.replace(**sections)
    except TypeError as exc:
        raise ConfigError("sweep", overrides, str(exc)) from None
    _check_gpu(config)
    return SweepPoint(config, cluster["replicas"], cluster["router"], tuple(params))


def _same(value, earlier) -> bool:
    """Whether `value` equals one of `earlier` (5 and 5.0 alike), a bool only a bool (True is not 1)."""
    return any(value == e and isinstance(value, bool) == isinstance(e, bool) for e in earlier)


def _check_cluster(cluster: dict) -> None:
    n = cluster["replicas"]
    require(isinstance(n, int) and not isinstance(n, bool) and n >= 1, "replicas", n, "must be an integer >= 1")
    from sim.planning.cluster import MAX_REPLICAS
    require(n <= MAX_REPLICAS, "replicas", n, f"must be at most {MAX_REPLICAS} (one engine and KV cache each, in"
                                              " one process)")
    require(cluster["router"] in ROUTERS, "router", cluster["router"], f"must be one of {ROUTERS}")


def _check_gpu(config: SimulationConfig) -> None:
    from kernels_cost_model import get_gpu
    try:
        get_gpu(config.deployment.gpu)
    except ConfigError as exc:
        raise ConfigError("deployment.gpu", config.deployment.gpu, exc.reason) from None


def grid(base: SimulationConfig, axes: dict[str, list]) -> list[SweepPoint]:
    """The cartesian product of `axes` ({axis: [values]}) applied to `base`, in axis order."""
    require(isinstance(axes, dict) and len(axes) > 0, "sweep", axes, "empty grid: give at least one axis")
    for name, values in axes.items():
        require(isinstance(values, (list, tuple)) and len(values) > 0, f"sweep.{name}", values,
                "must be a non-empty list of values")
        repeated = next((v for i, v in enumerate(values) if _same(v, values[:i])), None)
        require(repeated is None, f"sweep.{name}", values, f"gives {repeated!r} twice: the sweep would run the same"
                                                           " configs again; give each value once")
    names = list(axes)
    return [make_point(base, dict(zip(names, combo))) for combo in itertools.product(*axes.values())]


def points(base: SimulationConfig, overrides: list[dict]) -> list[SweepPoint]:
    """One point per {axis: value} dict (a list sweep rather than a grid)."""
    require(len(overrides) > 0, "sweep", overrides, "empty list of configs")
    return [make_point(base, o) for o in overrides]


def run_task(task: dict) -> dict:
    """Run one (config, seed) described by `SweepPoint.task`; returns its summary (worker entry point)."""
    config = SimulationConfig.from_dict(task["config"])
    if task["replicas"] == 1:
        return simulate(config).summary
    from sim.planning.cluster import simulate_cluster
    return simulate_cluster(config, task["replicas"], task["router"]).summary


def run_sweep(sweep_points: list[SweepPoint], seeds=(0,), *, executor: str = "pool", workers: int | None = None,
              address: str | None = None, out_dir: str | Path | None = None, progress: bool = False) -> pd.DataFrame:
    """Run every (point, seed); one row each: point index, key, seed, axis values, summary metrics.

    executor: "serial", "pool" (local processes, all cores) or "ray" (`address` joins a cluster).
    out_dir: cache folder; finished (point, seed) results found there are reused, not rerun.
    """
    require(len(sweep_points) > 0, "sweep", sweep_points, "empty grid: nothing to run")
    seeds = list(seeds)
    require(len(seeds) > 0 and all(is_int(s) and s >= 0 for s in seeds), "seeds", seeds,
            "must be a non-empty list of integers >= 0")
    jobs = [(i, p, s) for i, p in enumerate(sweep_points) for s in seeds]
    store = ResultStore(out_dir)
    summaries = {(i, s): store.get(p.key(s)) for i, p, s in jobs}
    todo = [(i, p, s) for i, p, s in jobs if summaries[(i, s)] is None]
    bar = Progress(len(jobs), unit="runs", enabled=progress, done=len(jobs) - len(todo))
    with make_executor(executor, workers=workers, address=address) as pool:
        for n, summary in pool.map_unordered(run_task, [p.task(s) for _, p, s in todo]):
            i, point, seed = todo[n]
            summaries[(i, seed)] = summary
            store.put(point.key(seed), summary)
            bar.update()
    bar.close()
    return pd.DataFrame([_row(i, p, s, summaries[(i, s)]) for i, p, s in jobs])


def _row(i: int, point: SweepPoint, seed: int, summary: dict) -> dict:
    row = {"point": i, "key": point.key(seed), "seed": seed, "replicas": point.replicas, "router": point.router}
    row.update({name: value for name, value in point.params if name not in CLUSTER_AXES})
    row.update(summary)
    return row


class ResultStore:
    """One small JSON file per finished (config, seed) under out_dir/results (no-op without out_dir)."""

    def __init__(self, out_dir: str | Path | None):
        self.dir = Path(out_dir) / "results" if out_dir is not None else None
        if self.dir is not None:
            require(not self.dir.exists() or self.dir.is_dir(), "out", str(out_dir),
                    f"holds a file named {self.dir.name}, where the sweep keeps its results folder")
            self.dir.mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> dict | None:
        """The summary a previous run stored for `key`; None where there is none, or where the file is
        damaged (truncated, not a stored summary): the point runs again and the file is rewritten."""
        path = None if self.dir is None else self.dir / f"{key}.json"
        if path is None or not path.exists():
            return None
        require(path.is_file(), "out", str(path), "is a folder where the sweep keeps a result file")
        try:
            doc = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            doc = None
        if isinstance(doc, dict) and doc.get("key") == key and isinstance(doc.get("summary"), dict) \
                and "completed" in doc["summary"]:
            return doc["summary"]
        warnings.warn(f"{path}: a damaged stored result; running the point again", stacklevel=2)
        return None

    def put(self, key: str, summary: dict) -> None:
        if self.dir is None:
            return
        write_text(self.dir / f"{key}.json", json.dumps({"key": key, "summary": summary}, allow_nan=True))
