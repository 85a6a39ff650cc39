"""One real run against its replay: the comparison tables and the plots."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from . import compare, plots
from .real_runs import RealRun
from .host import UNFITTED, HostFit
from .replay import Replay, replay, simulation_config

#: The issue's goal: these within 10 % of the measurement.
HEADLINE = ("ttft_s_mean", "tpot_s_mean", "e2e_s_mean", "duration_s")


@dataclass(frozen=True)
class RunComparison:
    name: str
    aggregates: pd.DataFrame       # metric, sim, real, rel_error
    per_request: dict[str, float]  # median |rel error| and correlation per latency
    queues: pd.DataFrame           # t, running/waiting real and sim
    curve: dict[str, float]        # running-curve error
    sim: Replay


def queue_curves(run: RealRun, sim: Replay) -> pd.DataFrame:
    """Per-second running/waiting, measured and simulated, on the replay clock."""
    ticks = run.tick_times()
    s = compare.sample_per_second(sim.steps, ticks)
    return pd.DataFrame({"t": ticks, "running_real": run.timeseries["running"].to_numpy(),
                         "waiting_real": run.timeseries["waiting"].to_numpy(),
                         "running_sim": s["num_running"].to_numpy(), "waiting_sim": s["num_waiting"].to_numpy()})


def compare_run(run: RealRun, arrivals: str = "queued", host: HostFit = UNFITTED,
                cost_model=None) -> RunComparison:
    """Replay `run` under its `simulation_config` with `host` (and `cost_model` instead of the
    deployment's, if given) and compare."""
    sim = replay(run, arrivals, simulation_config(run, host), cost_model)
    queues = _extend(queue_curves(run, sim), sim)
    both = compare.per_request(sim.requests, run.measured)
    curve = compare.curve_error(queues["running_sim"].to_numpy(), queues["running_real"].to_numpy())
    return RunComparison(run.name, compare.compare_aggregates(sim.requests, run.measured),
                         compare.per_request_summary(both), queues, curve, sim)


def _extend(queues: pd.DataFrame, sim: Replay) -> pd.DataFrame:
    """Add ticks until the simulation's last step too, so a slower simulation shows in the curve."""
    last = float(sim.steps["end_s"].max())
    t = queues["t"].to_numpy()
    if last <= t[-1]:
        return queues
    extra = t[-1] + np.arange(1, int(np.ceil(last - t[-1])) + 1)
    s = compare.sample_per_second(sim.steps, extra)
    tail = pd.DataFrame({"t": extra, "running_real": 0, "waiting_real": 0,
                         "running_sim": s["num_running"], "waiting_sim": s["num_waiting"]})
    return pd.concat([queues, tail], ignore_index=True)


def write_plots(c: RunComparison, run: RealRun, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    q = c.queues
    real = pd.DataFrame({"t": q["t"], "running": q["running_real"], "waiting": q["waiting_real"]})
    sim = pd.DataFrame({"t": q["t"], "running": q["running_sim"], "waiting": q["waiting_sim"]})
    return [plots.latency_cdfs(c.sim.requests, run.measured, c.name, out / f"{c.name}_latency_cdf.png"),
            plots.queues_over_time(sim, real, c.name, out / f"{c.name}_queues.png")]


def format_table(c: RunComparison) -> str:
    """Plain-text table: metric, sim, real, relative error (headline metrics marked *)."""
    lines = [f"{'metric':<26}{'sim':>12}{'real':>12}{'rel.err':>10}"]
    for row in c.aggregates.itertuples():
        mark = "*" if row.metric in HEADLINE else " "
        lines.append(f"{mark}{row.metric:<25}{row.sim:>12.4f}{row.real:>12.4f}{row.rel_error:>+10.1%}")
    lines.append(f" running curve: mean |sim-real| = {c.curve['mean_abs_diff']:.1f} requests "
                 f"({c.curve['rel_mean_abs_diff']:.1%} of the real mean)")
    for m in compare.LATENCIES:
        lines.append(f" per request {m}: median |rel.err| {c.per_request[f'{m}_median_abs_rel_error']:.1%}, "
                     f"corr {c.per_request[f'{m}_corr']:.3f}")
    return "\n".join(lines)


def markdown_rows(c: RunComparison) -> list[str]:
    """Markdown table rows `| run | metric | sim | real | rel. error |` for one run."""
    rows = []
    for row in c.aggregates.itertuples():
        scale, unit = (1e3, " ms") if row.metric.startswith("tpot") else (1.0, "")
        name = f"**{row.metric}**" if row.metric in HEADLINE else row.metric
        rows.append(f"| {c.name} | {name} | {row.sim * scale:.3f}{unit} | {row.real * scale:.3f}{unit} "
                    f"| {row.rel_error:+.1%} |")
    rows.append(f"| {c.name} | running curve, mean abs. diff | {c.curve['mean_abs_diff']:.1f} req "
                f"| | {c.curve['rel_mean_abs_diff']:.1%} of real mean |")
    return rows
