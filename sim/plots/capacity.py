"""Capacity plots: throughput-latency curves, SLO attainment vs rate, the cost frontier.

Each function takes DataFrames the capacity tools return (one row per run or per candidate) and
returns a matplotlib Figure; `save_capacity_plots(report, out_dir)` writes all three as PNGs.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from sim.plots.run_plots import new_figure, plot_throughput_latency


def _by_rate(runs: pd.DataFrame, group: str, columns: list[str]) -> pd.DataFrame:
    return runs.groupby([group, "rate"], as_index=False)[columns].mean().sort_values([group, "rate"])


def throughput_latency(runs: pd.DataFrame, group: str = "candidate", latency: str = "ttft_ms_p99",
                       slo_ms: float | None = None):
    """Latency (y) against achieved request throughput (x), one line per `group` value."""
    data = _by_rate(runs, group, ["request_throughput", latency])
    return plot_throughput_latency(data, x="request_throughput", metrics=(latency,), hue=group,
                                   slo={latency: slo_ms} if slo_ms is not None else None,
                                   title="Throughput vs latency, one replica")


def attainment_vs_rate(runs: pd.DataFrame, group: str = "candidate", min_attainment: float | None = None):
    """SLO attainment (fraction of requests meeting [slo]) against offered rate, per `group`."""
    data = _by_rate(runs, group, ["slo_attainment"])
    fig, (ax,) = new_figure(size=(6.4, 4.2))
    for name, part in data.groupby(group, sort=True):
        ax.plot(part["rate"], part["slo_attainment"], marker="o", label=str(name))
    if min_attainment is not None:
        ax.axhline(min_attainment, color="grey", linestyle="--", linewidth=1, label="target")
    ax.set(xlabel="offered rate (req/s)", ylabel="SLO attainment", ylim=(-0.02, 1.02),
           title="SLO attainment vs rate, one replica")
    ax.legend(fontsize=8)
    return fig


def pareto_front(table: pd.DataFrame, cost: str = "usd_per_hour", value: str = "headroom") -> pd.DataFrame:
    """Rows not beaten by a cheaper-or-equal row with more `value` (feasible rows only)."""
    rows = table[table["feasible"]].sort_values([cost, value], ascending=[True, False])
    best, keep = float("-inf"), []
    for index, row in rows.iterrows():
        if row[value] > best:
            keep.append(index)
            best = row[value]
    return rows.loc[keep]


def cost_frontier(table: pd.DataFrame, cost: str = "usd_per_hour", value: str = "headroom"):
    """Each feasible deployment's cost (x) and headroom (y); the Pareto frontier joined."""
    feasible = table[table["feasible"]]
    fig, (ax,) = new_figure(size=(6.4, 4.2))
    ax.scatter(feasible[cost], feasible[value], color="tab:blue")
    for _, row in feasible.iterrows():
        ax.annotate(f"{row['candidate']} x{int(row['replicas'])}", (row[cost], row[value]), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    front = pareto_front(table, cost, value)
    ax.plot(front[cost], front[value], color="tab:red", marker="o", markerfacecolor="none", markersize=12,
            drawstyle="steps-post", label="frontier")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="headroom 1")
    ax.set(xlabel=cost.replace("_", " "), ylabel=f"{value} (capacity / target rate)",
           title="Cost frontier of deployments meeting the SLO")
    ax.legend(fontsize=8)
    return fig


def save_capacity_plots(report, out_dir: str | Path, slo_ms: float | None = None,
                        min_attainment: float | None = None) -> list[Path]:
    """Write throughput_latency.png, slo_attainment.png and cost_frontier.png; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = []
    if not report.curves.empty:
        figures += [("throughput_latency.png", throughput_latency(report.curves, slo_ms=slo_ms)),
                    ("slo_attainment.png", attainment_vs_rate(report.curves, min_attainment=min_attainment))]
    if report.table["feasible"].any():
        figures.append(("cost_frontier.png", cost_frontier(report.table)))
    paths = []
    for name, fig in figures:
        fig.savefig(out / name, dpi=120)
        paths.append(out / name)
    return paths
