"""Plots across runs: latency (or any summary metric) against load, from a table with one row per run.

`plot_throughput_latency(df, x="workload.rate")` takes the table `servesim sweep` writes
(sweep.csv: axis columns with their dotted names, `seed`, summary columns) or any such table. Seeds
of the same configuration are averaged (the band spans their min to max); every other axis that
varies becomes its own line; the legend sits outside the plot area.
"""
from __future__ import annotations

import re

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kernels_cost_model.errors import is_number, require
from sim.api.metrics import legacy_key

DEFAULT_METRICS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")
LATENCY_KEY = re.compile(r"^(mean|median|std|p[\d.]+)_([a-z0-9]+)_ms$")
NOT_AXES = {"point", "key", "seed"}
LINE_STYLES = ("-", "--", ":", "-.")


def resolve_column(df: pd.DataFrame, name: str) -> str:
    """`name` itself, the one dotted column ending in `.name` ("rate" -> "workload.rate"), or the
    current name of an old summary key; ValueError listing the columns otherwise."""
    if name in df.columns:
        return name
    dotted = [c for c in df.columns if str(c).endswith("." + name)]
    if len(dotted) == 1:
        return dotted[0]
    new, _ = legacy_key(name)
    if new in df.columns:
        return new
    raise ValueError(f"column {name!r} not in the table; columns: {', '.join(map(str, df.columns))}")


def varied_axes(df: pd.DataFrame, x: str) -> list[str]:
    """Sweep axes besides `x` that take more than one value (dotted config names, replicas, router)."""
    axes = [c for c in df.columns if ("." in str(c) or c in ("replicas", "router")) and c != x
            and c not in NOT_AXES]
    return [c for c in axes if df[c].nunique(dropna=False) > 1]


def metric_label(key: str) -> tuple[str, str]:
    """'p99_ttft_ms' -> ('TTFT', 'p99'), 'request_throughput' -> ('request throughput', '')."""
    match = LATENCY_KEY.match(key)
    if match:
        return match.group(2).upper(), match.group(1)
    return key.replace("_", " "), ""


def _unit(values: np.ndarray) -> tuple[float, str]:
    finite = values[np.isfinite(values)]
    return (1e-3, "s") if finite.size and finite.max() >= 10_000 else (1.0, "ms")


def plot_throughput_latency(sweep: pd.DataFrame, x: str = "rate", metrics=DEFAULT_METRICS,
                            hue: str | list[str] | None = None, slo: dict | None = None,
                            title: str = "Latency vs load", x_label: str | None = None) -> Figure:
    """One panel per metric family (TTFT, TPOT, ...): `metrics` against `x`, seeds averaged.

    hue: column(s) that split lines; default every other axis that varies. slo: {metric: target in
    the metric's unit, e.g. ms}, drawn as a dashed line the y range always includes."""
    require(isinstance(sweep, pd.DataFrame), "sweep", type(sweep).__name__,
            "must be a pandas DataFrame with one row per run, e.g. pd.read_csv(\"sweep-out/sweep.csv\")")
    _check_slo(slo)
    x = resolve_column(sweep, x)
    metrics = [resolve_column(sweep, m) for m in ([metrics] if isinstance(metrics, str) else metrics)]
    require(len(metrics) > 0, "metrics", metrics, "give at least one metric column, e.g. [\"p99_ttft_ms\"]")
    hues = ([hue] if isinstance(hue, str) else list(hue)) if hue else varied_axes(sweep, x)
    hues = [resolve_column(sweep, h) for h in hues]
    families = list(dict.fromkeys(metric_label(m)[0] for m in metrics))
    fig = Figure(figsize=(5.2 * len(families) + 2.6, 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(families), squeeze=False).ravel())
    stats = sweep.groupby(hues + [x], dropna=False, sort=True)[metrics].agg(["mean", "min", "max"])
    groups = stats.groupby(level=list(range(len(hues))), sort=True) if hues else [(None, stats)]
    seeds = sweep["seed"].nunique() if "seed" in sweep else 1
    for g, (name, part) in enumerate(groups):
        values = name if isinstance(name, tuple) else (name,)  # np.atleast_1d would turn True into 1
        where = ", ".join(f"{h.split('.')[-1]}={v}" for h, v in zip(hues, values)) if hues else ""
        for metric in metrics:
            family = metric_label(metric)[0]
            style = LINE_STYLES[_same_family(metrics, family).index(metric) % len(LINE_STYLES)]
            _draw(axes[families.index(family)], part, x, metric, line_color(g, len(groups)), where,
                  _family_unit(sweep, metrics, family)[0], style=style, band=seeds > 1)
    for ax, family in zip(axes, families):
        _finish_panel(ax, sweep, family, metrics, slo or {}, x_label or _x_label(x))
    fig.suptitle(title + (f" (mean of {seeds} seeds; band: min to max)" if seeds > 1 else ""))
    return fig


def _check_slo(slo) -> None:
    require(slo is None or isinstance(slo, dict), "slo", slo, "must be a dict {metric: target}, e.g. {\"p99_ttft_ms\": 500}")
    for metric, target in (slo or {}).items():
        require(target is None or (is_number(target) and target > 0), f"slo.{metric}", target,
                "must be a number > 0 in the metric's unit (or None)")


def line_color(index: int, count: int):
    """Distinct colours for up to 20 lines: tab10 while it suffices, else tab20 (C10 would repeat C0)."""
    if count <= 10:
        return f"C{index % 10}"
    return matplotlib.colormaps["tab20"](index % 20)


def _same_family(metrics: list[str], family: str) -> list[str]:
    return [m for m in metrics if metric_label(m)[0] == family]


RATE_UNITS = {"request_throughput": "req/s", "request_goodput": "req/s", "output_throughput": "tok/s",
              "total_token_throughput": "tok/s", "max_output_tokens_per_s": "tok/s"}


def _family_unit(sweep: pd.DataFrame, metrics: list[str], family: str) -> tuple[float, str]:
    same = _same_family(metrics, family)
    if LATENCY_KEY.match(same[0]):
        return _unit(sweep[same].to_numpy(float))
    return 1.0, RATE_UNITS.get(same[0], "")


def _draw(ax, part: pd.DataFrame, x: str, metric: str, color: str, where: str, scale: float, style: str,
          band: bool) -> None:
    """One line: the seeds' mean of `metric` against `x`, and their min-max band if there are several."""
    xs = part.index.get_level_values(x).to_numpy(dtype=float)
    label = " ".join(filter(None, [metric_label(metric)[1], where]))
    ax.plot(xs, part[(metric, "mean")] * scale, marker="o", ms=4, color=color, ls=style, label=label)
    if band:
        ax.fill_between(xs, part[(metric, "min")] * scale, part[(metric, "max")] * scale, color=color,
                        alpha=0.12, lw=0)


def _finish_panel(ax, sweep: pd.DataFrame, family: str, metrics: list[str], slo: dict, x_label: str) -> None:
    same = _same_family(metrics, family)
    scale, unit = _family_unit(sweep, metrics, family)
    top = ax.get_ylim()[1]
    for metric, target in slo.items():
        metric = resolve_column(sweep, metric) if metric not in same else metric
        if metric in same and target is not None:
            ax.axhline(target * scale, color="red", ls="--", lw=1.2,
                       label=f"SLO: {metric_label(metric)[1]} {family} <= {target * scale:g} {unit}")
            top = max(top, 1.15 * target * scale)
    ax.set_ylim(bottom=0, top=top)
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"{family} ({unit})" if unit else family)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # (a lone unlabelled line needs no legend)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=7)


def _x_label(x: str) -> str:
    if x.split(".")[-1] in ("rate", "target_rate"):
        return "offered load (requests/s)"
    return x.replace("_", " ")
