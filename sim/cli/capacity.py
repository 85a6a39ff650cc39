"""CLI subcommands `servesim capacity` and `servesim sweep` (wired into sim.cli.main by add_*_parser).

    servesim capacity --config examples/plan.toml --out capacity-out
    servesim sweep --config examples/sweep.toml --out sweep-out --executor pool

Handlers return exit codes: 0 ok, 2 configuration error (the message names field and value).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from sim.api.sections import read_toml
from kernels_cost_model.errors import ConfigError, require
from sim.core.fields import is_int
from sim.planning.executors import EXECUTORS

TABLE_COLUMNS = ["rank", "candidate", "replicas", "num_gpus", "usd_per_hour", "usd_per_million_output_tokens",
                 "goodput_per_gpu", "capacity_per_replica", "capacity_95ci", "headroom", "feasible", "p99_ttft_ms_at_target",
                 "p99_tpot_ms_at_target"]
CAPACITY_DESCRIPTION = """\
Rank deployments (GPU x tensor parallelism x replicas x engine flags) by cost for a traffic and an
SLO target, from a plan TOML (docs/capacity.md, examples/plan.toml). Per candidate: the max
sustainable rate of one replica (bisection over rates, several seeds, with a 95% interval), the
replicas needed, a cluster run at the target rate that confirms it, $/hour and $/million output
tokens. Writes deployments.csv, curves.csv and throughput_latency / slo_attainment /
cost_frontier plots to --out."""
SWEEP_DESCRIPTION = """\
Run a grid (or list) of configurations x seeds in parallel, one summary row per run, from a sweep
TOML: the config sections plus [sweep] axes (rate = [5, 10, 20], engine.max_num_seqs = [...]) and
seeds (examples/sweep.toml). Writes sweep.csv, results/<key>.json per run (a rerun reuses them) and
plots/latency_vs_load.png and plots/throughput_vs_load.png (seeds averaged, one line per other axis)."""


def add_capacity_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("capacity", help="rank deployments by cost for a traffic and an SLO (plan.toml)",
                              description=CAPACITY_DESCRIPTION)
    p.add_argument("--config", required=True, help="plan.toml (see docs/capacity.md)")
    p.add_argument("--out", default="capacity-out",
                   help="folder for deployments.csv, curves.csv and plots (default capacity-out)")
    p.add_argument("--executor", choices=EXECUTORS, help="override [search].executor")
    p.add_argument("--workers", type=int, help="worker processes (default: all cores)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.set_defaults(func=run_capacity)
    return p


def add_sweep_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("sweep", help="run a grid of configs x seeds in parallel into one table",
                              description=SWEEP_DESCRIPTION)
    p.add_argument("--config", required=True, help="sweep TOML: config sections plus [sweep] axes and seeds")
    p.add_argument("--out", default="sweep-out",
                   help="folder: results/<key>.json per run (a rerun reuses them), sweep.csv (default sweep-out)")
    p.add_argument("--executor", choices=EXECUTORS, default="pool",
                   help="serial, pool (local processes, the default) or ray")
    p.add_argument("--address", help="Ray cluster address (executor ray); none starts a local cluster")
    p.add_argument("--workers", type=int, help="processes / Ray CPUs (default: all cores)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line on stderr (default: when stderr is a terminal)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots")
    p.set_defaults(func=run_sweep_cmd)
    return p


def run_capacity(args) -> int:
    from sim.plots.capacity import save_capacity_plots
    from sim.planning.deployments import search_deployments
    from sim.planning.plan import Plan
    from sim.planning.topology import search_topologies
    from sim.api.table_io import check_output_folder, make_output_folder
    try:
        check_workers(args.workers)
        check_output_folder(args.out)
        plan = Plan.from_toml(args.config)
        if args.executor or args.workers:
            import dataclasses
            plan = dataclasses.replace(plan, executor=args.executor or plan.executor, workers=args.workers)
        report = search_topologies(plan) if plan.topologies else search_deployments(plan)
    except ConfigError as exc:
        print(f"servesim: error: {exc}", file=sys.stderr)
        return 2
    out = make_output_folder(args.out)
    report.table.to_csv(out / "deployments.csv", index=False)
    report.curves.to_csv(out / "curves.csv", index=False)
    print(format_table(report.table, plan.target_rate))
    best = recommended(report.table)
    print(describe_recommended(best, plan.target_rate, plan.base.workload.num_requests))
    if not args.no_plots:
        for path in save_capacity_plots(report, out, plan.target, best):
            print(f"wrote {path}")
    return 0


def recommended(table: pd.DataFrame) -> dict | None:
    """The deployment ranked first, if feasible: label, units (replicas) and one unit's capacity interval."""
    feasible = table[table["feasible"].astype(bool)]
    if feasible.empty:
        return None
    row = feasible.iloc[0]
    return {"label": row["candidate"], "replicas": int(row["replicas"]), "rate": float(row["capacity_per_replica"]),
            "low": float(row["capacity_low"]), "high": float(row["capacity_high"]),
            "seeds": int(row.get("capacity_seeds", 0)), "usd_per_hour": float(row["usd_per_hour"]),
            "bounded": bool(row.get("capacity_bounded", True))}


MIN_ARRIVAL_SPAN_S = 30.0  # shorter runs end before a slightly overloaded queue shows: ramp-up and drain flatter them


def describe_recommended(best: dict | None, target_rate: float, num_requests: int | None = None) -> str:
    """One paragraph on the recommended deployment and how sure its capacity is (seeds, run length)."""
    if best is None:
        return f"no candidate sustains {target_rate:g} req/s within [search] max_replicas"
    text = (f"recommended: {best['label']} x {best['replicas']} units, ${best['usd_per_hour']:.2f}/hour; "
            f"one unit (an instance or a P+D group) sustains {'' if best.get('bounded', True) else 'at least '}"
            f"{best['rate']:.3g} req/s ")
    if best["seeds"] <= 1:
        text += "(one seed, so no 95% interval: add seeds ([search] seeds) to get one)"
    else:
        text += f"(95% interval {best['low']:.3g} to {best['high']:.3g} over {best['seeds']} seeds)"
    if not best.get("bounded", True):
        text += ("; the target held at every rate the search tried, so this is the highest it tried, not a"
                 " limit found (a looser target, e.g. min_attainment with no [slo], may never fail)")
    if best["seeds"] > 1 and best["low"] < 0.5 * best["rate"]:
        text += "; the interval is wide: add seeds ([search] seeds) to narrow it"
    span = num_requests / best["rate"] if num_requests and best["rate"] > 0 else math.inf
    if span < MIN_ARRIVAL_SPAN_S:
        text += (f"; at that rate a run of {num_requests} requests lasts only {span:.3g} s of arrivals, short enough"
                 f" for ramp-up and drain to overstate capacity: raise [workload] num_requests to"
                 f" {math.ceil(MIN_ARRIVAL_SPAN_S * best['rate'])} or more")
    return text


def format_table(table: pd.DataFrame, target_rate: float) -> str:
    """The ranked table as text."""
    seeds = table["capacity_seeds"] if "capacity_seeds" in table else [2] * len(table)
    spread = [f"{lo:.3g} to {hi:.3g}" if n > 1 else "- (1 seed)" if n else "-"
              for lo, hi, n in zip(table["capacity_low"], table["capacity_high"], seeds)]
    table = table.assign(capacity_95ci=spread)
    shown = table[[c for c in TABLE_COLUMNS if c in table.columns]]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.3g}".format):
        return f"deployments for {target_rate:g} req/s, cheapest first:\n{shown.to_string(index=False)}"


def load_sweep(path: str | Path):
    """(points, seeds) from a sweep TOML: config sections, [sweep] axes (or `configs` list) and seeds."""
    from sim.api.simulator import SimulationConfig
    from sim.planning.sweep import grid, points
    data = read_toml(path)
    sweep = data.pop("sweep", None)
    base = SimulationConfig.from_dict(data)
    require(sweep is not None, "sweep", sweep, "missing [sweep] table of axes")
    require(isinstance(sweep, dict), "sweep", sweep, "must be a table of axes")
    seeds = sweep.pop("seeds", [base.seed])
    require(isinstance(seeds, list) and seeds and all(is_int(s) and s >= 0 for s in seeds), "sweep.seeds", seeds,
            "must be a non-empty list of integers >= 0")
    configs = sweep.pop("configs", None)
    if configs is None:
        return grid(base, flatten(sweep)), seeds
    require(isinstance(configs, list) and configs and all(isinstance(c, dict) for c in configs), "sweep.configs",
            configs, "must be a non-empty list of tables like { workload = { rate = 5.0 } }")
    require(not sweep, "sweep.configs", configs,
            f"cannot be combined with axes {sorted(flatten(sweep))}: give a list of configs or axes, not both")
    return points(base, [flatten(c) for c in configs]), seeds


def flatten(table: dict, prefix: str = "") -> dict:
    """{"engine": {"max_num_seqs": [..]}} -> {"engine.max_num_seqs": [..]} (TOML dotted keys)."""
    out = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        out.update(flatten(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def check_workers(workers: int | None) -> None:
    """--workers, named as the flag (before any file is read)."""
    require(workers is None or workers >= 1, "--workers", workers, "must be an integer >= 1 (unset: all cores)")


def show_progress(flag: bool | None) -> bool:
    """--progress / --no-progress, else only on a terminal (a log file gets no carriage-return bars)."""
    return flag if flag is not None else sys.stderr.isatty()


def run_sweep_cmd(args) -> int:
    from sim.api.table_io import atomic_path, check_output_folder, make_output_folder
    from sim.planning.sweep import run_sweep
    try:
        require(not args.address or args.executor == "ray", "--address", args.address,
                f"joins a Ray cluster: give it with --executor ray (the executor is {args.executor})")
        check_workers(args.workers)
        check_output_folder(args.out)
        sweep_points, seeds = load_sweep(args.config)  # (a bad file leaves no empty --out folder behind)
        make_output_folder(args.out)
        df = run_sweep(sweep_points, seeds, executor=args.executor, workers=args.workers, address=args.address,
                       out_dir=args.out, progress=show_progress(args.progress))
    except ConfigError as exc:
        print(f"servesim: error: {exc}", file=sys.stderr)
        return 2
    path = Path(args.out) / "sweep.csv"
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)
    print(f"{len(df)} runs ({len(sweep_points)} configs x {len(seeds)} seeds) -> {path}")
    if not args.no_plots:
        for plot_path in save_sweep_plots(df, Path(args.out) / "plots"):
            print(f"wrote {plot_path}")
    return 0


def save_sweep_plots(df: pd.DataFrame, out: Path) -> list[Path]:
    """Latency and throughput against the sweep's load axis (its rate, else its first axis)."""
    from sim.plots.sweep import plot_throughput_latency, varied_axes
    axes = varied_axes(df, x="")
    loads = [a for a in axes if a.split(".")[-1] in ("rate", "target_rate")]
    x = (loads or [a for a in axes if pd.api.types.is_numeric_dtype(df[a])] or [None])[0]
    if x is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    figures = {"latency_vs_load.png": plot_throughput_latency(df, x=x),
               "throughput_vs_load.png": plot_throughput_latency(
                   df, x=x, metrics=("request_throughput", "request_goodput"), title="Throughput vs load")}
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=120)
    return [out / name for name in figures]


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
