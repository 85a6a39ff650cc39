"""Sweep throughput: configs/s serially, on the local process pool and (if installed) on local Ray.

    python benchmarks/sweep_speed.py [--configs 48] [--requests 200] [--ray]

Each config is a Llama-3.1-8B-on-H100 roofline run of `--requests` ShareGPT-like requests; the
tables from every executor are checked to be identical.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from sim import SimulationConfig  # noqa: E402
from sim.planning.sweep import grid, run_sweep  # noqa: E402


def sweep_points(n_configs: int, n_requests: int):
    base = SimulationConfig.from_dict({"workload": {"num_requests": n_requests}})
    axes = {"rate": [2, 4, 8, 16, 32, 64], "max_num_seqs": [32, 64, 128, 256], "chunked_prefill": [True, False]}
    return grid(base, axes)[:n_configs]


def timed(points, executor: str) -> tuple[float, pd.DataFrame]:
    start = time.perf_counter()
    table = run_sweep(points, seeds=[0], executor=executor)
    return time.perf_counter() - start, table


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=48)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--ray", action="store_true", help="also time a local Ray cluster")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    points = sweep_points(args.configs, args.requests)
    executors = ["serial", "pool"] + (["ray"] if args.ray else [])
    print(f"{len(points)} configs x {args.requests} requests, {os.cpu_count()} cores")
    reference = None
    for name in executors:
        seconds, table = timed(points, name)
        same = "" if reference is None else f"  identical to serial: {table.equals(reference)}"
        reference = table if reference is None else reference
        print(f"{name:>6}: {seconds:6.2f} s  {len(points) / seconds:6.2f} configs/s{same}")


if __name__ == "__main__":
    main()
