"""Capacity plots: throughput-latency curves, SLO attainment vs rate, the cost frontier.

Each function takes DataFrames the capacity tools return (one row per run or per candidate) and
returns a matplotlib Figure; `save_capacity_plots(report, out_dir)` writes all three as PNGs.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from sim.api.metrics import latency_key
from sim.plots.run_plots import legend_outside, new_figure
from sim.plots.sweep import line_color, plot_throughput_latency


def throughput_latency(runs: pd.DataFrame, group: str = "candidate", percentile: int = 99,
                       slo_ms: dict | None = None, capacity: dict | None = None):
    """p<percentile> TTFT and TPOT (y) against the offered rate (x), one line per `group` value.

    slo_ms: {"ttft": ms, "tpot": ms} bounds drawn as dashed lines; capacity: {"label", "rate", "low",
    "high"} of the recommended deployment, shaded as its 95% interval."""
    metrics = [latency_key(m, percentile) for m in ("ttft", "tpot")]
    slo = {latency_key(m, percentile): v for m, v in (slo_ms or {}).items() if v is not None}
    fig = plot_throughput_latency(runs, x="rate", metrics=metrics, hue=group, slo=slo,
                                  title="Latency vs offered rate, one unit (an instance or a P+D group)", x_label="offered rate (req/s)")
    if capacity:
        for ax in fig.axes:
            color = _line_color(ax, f"{group}={capacity['label']}")
            spread = (f"(95% CI {capacity['low']:.3g} to {capacity['high']:.3g})" if capacity.get("seeds", 2) > 1
                      else "(one seed: no 95% CI)")
            ax.axvspan(capacity["low"], capacity["high"], color=color, alpha=0.12,
                       label=f"{capacity['label']}: capacity {capacity['rate']:.3g} req/s\n{spread}")
            ax.axvline(capacity["rate"], color=color, lw=1)
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=7)
    return fig


def _line_color(ax, label_end: str) -> str:
    """The colour of the line whose label ends with `label_end` (the recommended candidate's), else grey."""
    for line in ax.get_lines():
        if str(line.get_label()).endswith(label_end):
            return line.get_color()
    return "tab:gray"


def attainment_vs_rate(runs: pd.DataFrame, group: str = "candidate", percentile: int = 99,
                       bounds: str = "", min_attainment: float | None = None):
    """Fraction of admitted requests (prompts over max_model_len are rejected at any load) within the
    target's bounds against offered rate, per `group`; a p<percentile> bound holds while at least
    percentile % of them are within it."""
    admitted = runs["num_requests"] - runs["num_rejected"] if "num_rejected" in runs else None
    runs = runs.assign(slo_attainment=runs["slo_attainment"] * runs["num_requests"] / admitted.clip(lower=1)
                       if admitted is not None else runs["slo_attainment"])
    data = runs.groupby([group, "rate"], as_index=False)["slo_attainment"].mean().sort_values([group, "rate"])
    fig, (ax,) = new_figure(size=(8.4, 4.2))
    groups = data.groupby(group, sort=True)
    for index, (name, part) in enumerate(groups):
        ax.plot(part["rate"], part["slo_attainment"], marker="o", label=str(name), color=line_color(index, len(groups)))
    ax.axhline(percentile / 100, color="red", ls="--", lw=1.2, label=f"{percentile}% (a p{percentile} bound)")
    if min_attainment is not None:
        ax.axhline(min_attainment, color="grey", ls="--", lw=1, label=f"min_attainment {min_attainment:g}")
    low = min([percentile / 100, min_attainment or 1.0, float(data["slo_attainment"].min())])
    ax.set(xlabel="offered rate (req/s)", ylabel="fraction of admitted requests\nwithin the bounds",
           ylim=(max(0.0, low - 0.25 * (1 - low) - 0.01), 1.002),
           title=f"SLO attainment vs offered rate, one unit{': ' + bounds if bounds else ''}")
    ax.grid(alpha=0.3)
    legend_outside(ax)
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


def save_capacity_plots(report, out_dir: str | Path, target=None, recommended: dict | None = None) -> list[Path]:
    """Write throughput_latency.png, slo_attainment.png and cost_frontier.png; returns their paths.

    target: the plan's CapacityTarget (bounds drawn, percentile used); recommended: the capacity
    {"label", "rate", "low", "high"} of the deployment ranked first."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    p = target.percentile if target is not None else 99
    slo_ms = {"ttft": _ms(target, "ttft_p99_s"), "tpot": _ms(target, "tpot_p99_s")}
    bounds = ", ".join(f"{m.upper()} <= {v:g} ms" for m, v in slo_ms.items() if v is not None)
    figures = []
    if not report.curves.empty:
        figures += [("throughput_latency.png", throughput_latency(report.curves, percentile=p, slo_ms=slo_ms,
                                                                  capacity=recommended)),
                    ("slo_attainment.png", attainment_vs_rate(report.curves, percentile=p, bounds=bounds,
                                                              min_attainment=getattr(target, "min_attainment", None)))]
    if report.table["feasible"].any():
        figures.append(("cost_frontier.png", cost_frontier(report.table)))
    paths = []
    for name, fig in figures:
        fig.savefig(out / name, dpi=120)
        paths.append(out / name)
    return paths


def _ms(target, name: str) -> float | None:
    value = getattr(target, name, None) if target is not None else None
    return value * 1e3 if value is not None else None
