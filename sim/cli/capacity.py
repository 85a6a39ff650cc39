"""CLI subcommands `servesim capacity` and `servesim sweep` (wired into sim.cli.main by add_*_parser).

    servesim capacity --config examples/plan.toml --out capacity-out
    servesim sweep --config examples/sweep.toml --out sweep-out --executor pool

Handlers return exit codes: 0 ok, 2 configuration error (the message names field and value).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from sim.api.simulator import read_toml
from kernels_cost_model.errors import ConfigError
from sim.planning.executors import EXECUTORS

TABLE_COLUMNS = ["rank", "candidate", "replicas", "num_gpus", "usd_per_hour", "usd_per_million_output_tokens",
                 "capacity_per_replica", "headroom", "feasible", "ttft_ms_p99_at_target", "tpot_ms_p99_at_target"]


def add_capacity_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("capacity", help="rank deployments by cost for a traffic and an SLO (plan.toml)")
    p.add_argument("--config", required=True, help="plan.toml (see docs/capacity.md)")
    p.add_argument("--out", default="capacity-out", help="folder for deployments.csv, curves.csv and plots")
    p.add_argument("--executor", choices=EXECUTORS, help="override [search].executor")
    p.add_argument("--workers", type=int, help="worker processes (default: all cores)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.set_defaults(func=run_capacity)
    return p


def add_sweep_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("sweep", help="run a grid of configs x seeds in parallel into one table")
    p.add_argument("--config", required=True, help="sweep TOML: config sections plus [sweep] axes and seeds")
    p.add_argument("--out", default="sweep-out", help="folder: results/<key>.json per run, sweep.csv")
    p.add_argument("--executor", choices=EXECUTORS, default="pool")
    p.add_argument("--address", help="Ray cluster address (executor ray); none starts a local cluster")
    p.add_argument("--workers", type=int, help="processes / Ray CPUs (default: all cores)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_sweep_cmd)
    return p


def run_capacity(args) -> int:
    from sim.plots.capacity import save_capacity_plots
    from sim.planning.deployments import search_deployments
    from sim.planning.plan import Plan
    try:
        plan = Plan.from_toml(args.config)
        if args.executor or args.workers:
            import dataclasses
            plan = dataclasses.replace(plan, executor=args.executor or plan.executor, workers=args.workers)
        report = search_deployments(plan)
    except ConfigError as exc:
        print(f"servesim: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report.table.to_csv(out / "deployments.csv", index=False)
    report.curves.to_csv(out / "curves.csv", index=False)
    print(format_table(report.table, plan.target_rate))
    if not args.no_plots:
        slo_ms = plan.target.ttft_p99_s * 1e3 if plan.target.ttft_p99_s else None
        for path in save_capacity_plots(report, out, slo_ms, plan.target.min_attainment):
            print(f"wrote {path}")
    return 0


def format_table(table: pd.DataFrame, target_rate: float) -> str:
    """The ranked table as text."""
    shown = table[[c for c in TABLE_COLUMNS if c in table.columns]]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.3g}".format):
        return f"deployments for {target_rate:g} req/s, cheapest first:\n{shown.to_string(index=False)}"


def load_sweep(path: str | Path):
    """(points, seeds) from a sweep TOML: config sections, [sweep] axes (or `configs` list) and seeds."""
    from sim.api.simulator import SimulationConfig
    from sim.planning.sweep import grid, points
    data = read_toml(path)
    sweep = data.pop("sweep", None)
    if not isinstance(sweep, dict):
        raise ConfigError("sweep", sweep, "missing [sweep] table of axes")
    base = SimulationConfig.from_dict(data)
    seeds = sweep.pop("seeds", [base.seed])
    configs = sweep.pop("configs", None)
    if configs is not None:
        return points(base, [flatten(c) for c in configs]), seeds
    return grid(base, flatten(sweep)), seeds


def flatten(table: dict, prefix: str = "") -> dict:
    """{"engine": {"max_num_seqs": [..]}} -> {"engine.max_num_seqs": [..]} (TOML dotted keys)."""
    out = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        out.update(flatten(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def run_sweep_cmd(args) -> int:
    from sim.api.table_io import atomic_path, check_output_folder
    from sim.planning.sweep import run_sweep
    try:
        check_output_folder(args.out)
        sweep_points, seeds = load_sweep(args.config)
        df = run_sweep(sweep_points, seeds, executor=args.executor, workers=args.workers, address=args.address,
                       out_dir=args.out, progress=not args.no_progress)
    except ConfigError as exc:
        print(f"servesim: error: {exc}", file=sys.stderr)
        return 2
    path = Path(args.out) / "sweep.csv"
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)
    print(f"{len(df)} runs ({len(sweep_points)} configs x {len(seeds)} seeds) -> {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m sim.cli.capacity ...`) until sim.cli.main wires these in."""
    parser = argparse.ArgumentParser(prog="servesim")
    sub = parser.add_subparsers(dest="command", required=True)
    add_capacity_parser(sub)
    add_sweep_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
