"""Where sweep tasks run: serially, on a local process pool, or on a Ray cluster.

An executor is a context manager with `map_unordered(fn, tasks) -> iterator of (index, result)`,
yielding each result as it finishes. `fn` must be a module-level function and tasks plain data, so
results do not depend on where they ran (each task carries its own seed; no global RNG).
"""
from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from kernels_cost_model.errors import require

EXECUTORS = ("serial", "pool", "ray")
PROJECT_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sim", "policies", "workloads", "kernels_cost_model")


class SerialExecutor:
    """In this process, in order (the reference the others must match)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def map_unordered(self, fn, tasks):
        for i, task in enumerate(tasks):
            yield i, fn(task)


class PoolExecutor(SerialExecutor):
    """A local process pool, one worker per core by default (forkserver on POSIX, else spawn)."""

    def __init__(self, workers: int | None = None):
        self.workers = workers or os.cpu_count() or 1
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        self.context = multiprocessing.get_context(method)
        if method == "forkserver":
            self.context.set_forkserver_preload(["sim.planning.sweep"])
        self.pool = None

    def __enter__(self):
        self.pool = ProcessPoolExecutor(self.workers, mp_context=self.context)
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown(cancel_futures=True)

    def map_unordered(self, fn, tasks):
        futures = {self.pool.submit(fn, task): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            yield futures[future], future.result()


class RayExecutor(SerialExecutor):
    """Ray: joins the cluster at `address`, or starts a local one (num_cpus=workers) without one.

    A local cluster finds the project through PYTHONPATH; a remote one gets the project's packages
    shipped as `py_modules` (or have `servesim` installed on the cluster's nodes).
    """

    def __init__(self, workers: int | None = None, address: str | None = None):
        try:
            import ray
        except ImportError:
            raise ImportError("executor='ray' needs Ray: pip install 'servesim[ray]'") from None
        self.ray, self.workers, self.address, self.started = ray, workers, address, False

    def __enter__(self):
        if not self.ray.is_initialized():
            self.ray.init(**self._init_args())
            self.started = True
        return self

    def _init_args(self) -> dict:
        if self.address:
            modules = [str(PROJECT_ROOT / p) for p in PACKAGES]
            return {"address": self.address, "runtime_env": {"py_modules": modules}}
        path = os.pathsep.join([str(PROJECT_ROOT), *sys.path[1:]])
        return {"num_cpus": self.workers or os.cpu_count(), "include_dashboard": False,
                "runtime_env": {"env_vars": {"PYTHONPATH": path}}, "log_to_driver": False}

    def __exit__(self, *exc) -> None:
        if self.started:
            self.ray.shutdown()

    def map_unordered(self, fn, tasks):
        remote = self.ray.remote(fn)
        refs = {remote.remote(task): i for i, task in enumerate(tasks)}
        pending = list(refs)
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1)
            for ref in ready:
                yield refs[ref], self.ray.get(ref)


def make_executor(name: str, workers: int | None = None, address: str | None = None):
    """The executor called `name` ("serial", "pool" or "ray")."""
    require(name in EXECUTORS, "executor", name, f"must be one of {EXECUTORS}")
    require(workers is None or (isinstance(workers, int) and workers >= 1), "workers", workers,
            "must be an integer >= 1")
    if name == "serial":
        return SerialExecutor()
    if name == "pool":
        return PoolExecutor(workers)
    return RayExecutor(workers, address)
