"""Plots of a run (and of a sweep of runs), as matplotlib Figures.

Figures are built with `matplotlib.figure.Figure` directly, not pyplot: no global figure state, and
`fig.savefig("x.png")` renders with the Agg backend whatever backend is active. Every function
returns the Figure; `save_plots` writes the standard set for one run.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.api.metrics import itl_values

PREFILL, DECODE, QUEUE = "#e8743b", "#1f77b4", "#bbbbbb"
LATENCIES = (  # (per-request column or "itl", title, unit scale, unit)
    ("ttft_s", "TTFT (time to first token)", 1e3, "ms"),
    ("tpot_s", "TPOT (time per output token, excl. first)", 1e3, "ms"),
    ("itl", "ITL (inter-token latency)", 1e3, "ms"),
    ("e2e_s", "E2E latency", 1.0, "s"),
)


def new_figure(rows: int = 1, cols: int = 1, size=(8, 4.5), **kw):
    """A pyplot-free Figure with constrained layout and its axes, flattened."""
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, **kw)
    return fig, axes.ravel()


def _done(results) -> pd.DataFrame:
    return results.requests[results.requests["completed"].astype(bool)]


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def plot_latency_cdfs(results) -> Figure:
    """Empirical CDFs of TTFT, TPOT, ITL and E2E latency over completed requests, p50/p99 marked."""
    fig, axes = new_figure(2, 2, size=(10, 7))
    done = _done(results)
    for ax, (column, title, scale, unit) in zip(axes, LATENCIES):
        values = (itl_values(results.token_times, results.requests["completed"].astype(bool))
                  if column == "itl" else done[column].to_numpy(dtype=float))
        values = np.sort(values[~np.isnan(values)]) * scale
        ax.set_title(title)
        ax.set_xlabel(f"{title.split(' ')[0]} ({unit})")
        ax.set_ylabel("fraction of " + ("token gaps" if column == "itl" else "requests"))
        ax.grid(alpha=0.3)
        if not values.size:
            ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes)
            continue
        ax.plot(values, np.arange(1, values.size + 1) / values.size, color=DECODE)
        for q, style in ((50, ":"), (99, "--")):
            v = np.percentile(values, q)
            ax.axvline(v, color="k", ls=style, lw=1, label=f"p{q} = {_fmt(v)} {unit}")
        ax.set_ylim(0, 1.01)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Latency distributions ({len(done)} completed requests)")
    return fig


def _step_ends(steps: pd.DataFrame) -> np.ndarray:
    return (steps["start_time"] + steps["duration"]).to_numpy(dtype=float)


def plot_kv_occupancy(results) -> Figure:
    """KV-cache blocks in use over time (% of the cache), steps with preemptions marked."""
    fig, (ax,) = new_figure(size=(10, 4))
    steps = results.steps
    total = results.meta.get("num_gpu_blocks")
    occ = 100 * steps["kv_blocks_used"].to_numpy(dtype=float) / total
    t = _step_ends(steps)
    ax.plot(t, occ, drawstyle="steps-post", color=DECODE, lw=1, label="KV blocks in use")
    ax.axhline(90, color="grey", ls="--", lw=1, label="90%")
    hit = steps["num_preempted"].to_numpy() > 0
    if hit.any():
        ax.scatter(t[hit], occ[hit], marker="x", color="red", zorder=3,
                   label=f"preemption ({int(steps['num_preempted'].sum())} in total)")
    else:
        ax.plot([], [], " ", label="no preemptions")
    ax.set_ylim(0, 105)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV cache occupancy (%)")
    ax.set_title(f"KV-cache occupancy ({total} blocks of {results.meta.get('block_size')} tokens)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    return fig


def _binned(steps: pd.DataFrame, columns: list[str], bins: int) -> tuple[np.ndarray, pd.DataFrame]:
    """Bin edges, and the mean of `columns` per step within each of `bins` equal time bins
    (bins without steps are 0)."""
    t = _step_ends(steps)
    edges = np.linspace(steps["start_time"].min(), t.max(), bins + 1)
    which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    return edges, steps[columns].astype(float).groupby(which).mean().reindex(range(bins), fill_value=0.0)


def plot_batch_composition(results, bins: int = 120) -> Figure:
    """Prefill vs decode tokens per step, and running vs waiting requests, over time."""
    fig, (top, bottom) = new_figure(2, 1, size=(10, 6.5), sharex=True)
    steps = results.steps
    if steps.empty:
        top.text(0.5, 0.5, "no steps", ha="center", transform=top.transAxes)
        return fig
    edges, tokens = _binned(steps, ["num_prefill_tokens", "num_decode_tokens"], bins)
    decode = tokens["num_decode_tokens"].to_numpy()
    top.stairs(decode, edges, fill=True, color=DECODE, label="decode tokens")
    top.stairs(decode + tokens["num_prefill_tokens"].to_numpy(), edges, baseline=decode, fill=True,
               color=PREFILL, label="prefill tokens (incl. chunks)")
    top.set_ylabel("tokens per step\n(mean per time bin)")
    top.set_title("Batch composition")
    top.legend(loc="upper right", fontsize=8)
    t = _step_ends(steps)
    bottom.plot(t, steps["num_running"], drawstyle="steps-post", color=DECODE, lw=1, label="running")
    bottom.plot(t, steps["num_waiting"], drawstyle="steps-post", color=PREFILL, lw=1, label="waiting")
    bottom.set_ylabel("requests")
    bottom.set_xlabel("simulated time (s)")
    bottom.legend(loc="upper right", fontsize=8)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig


def plot_queue_length(results) -> Figure:
    """Waiting requests over time, and each request's queueing delay against its arrival time."""
    fig, (top, bottom) = new_figure(2, 1, size=(10, 6), sharex=True)
    steps, done = results.steps, _done(results)
    top.plot(_step_ends(steps), steps["num_waiting"], drawstyle="steps-post", color=PREFILL, lw=1)
    top.set_ylabel("waiting requests\n(incl. preempted)")
    top.set_title("Queue length")
    bottom.scatter(done["arrival_time"], 1e3 * done["queueing_s"], s=4, color=DECODE, alpha=0.6,
                   label="one dot per request, at its arrival time")
    bottom.legend(loc="upper right", fontsize=8)
    bottom.set_ylabel("queueing delay (ms)\n(arrival to first scheduled)")
    bottom.set_xlabel("simulated time (s)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig


def plot_timeline(results, max_requests: int = 50) -> Figure:
    """Per-request Gantt chart of the first `max_requests`: queued, prefill, decode."""
    req = results.requests.head(max_requests)
    fig, (ax,) = new_figure(size=(10, max(3.0, 0.18 * len(req) + 1.5)))
    y = np.arange(len(req))
    phases = ((req["arrival_time"], req["first_scheduled_time"], QUEUE, "queued"),
              (req["first_scheduled_time"], req["first_token_time"], PREFILL, "prefill (to first token)"),
              (req["first_token_time"], req["finish_time"], DECODE, "decode"))
    for start, end, color, label in phases:
        width = (end - start).fillna(0).to_numpy(dtype=float)
        ax.barh(y, width, left=start.fillna(0).to_numpy(dtype=float), height=0.8, color=color,
                label=label)
    ax.set_yticks(y, req["request_id"].astype(str), fontsize=6 if len(req) > 30 else 8)
    ax.set_ylim(len(req) - 0.5, -0.5)
    ax.set_xlabel("simulated time (s)")
    shown = f"first {len(req)} of {len(results.requests)}" if len(results.requests) > len(req) else "all"
    ax.set_title(f"Request timeline ({shown} requests)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return fig


def _metric_label(key: str) -> str:
    """'ttft_ms_p99' -> 'TTFT p99 (ms)'; other keys pass through with underscores as spaces."""
    parts = key.split("_")
    if len(parts) == 3 and parts[1] in ("ms", "s"):
        return f"{parts[0].upper()} {parts[2]} ({parts[1]})"
    return key.replace("_", " ")


def plot_throughput_latency(sweep: pd.DataFrame, x: str = "rate",
                            metrics=("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99"),
                            hue: str | None = None, slo: dict | None = None,
                            title: str = "Latency vs load") -> Figure:
    """Latency against load across a sweep: one row per run, `x` (e.g. rate, request_throughput)
    and summary columns. One panel per latency family; `hue` splits lines (e.g. policy);
    `slo` maps a metric to a target drawn as a dashed line, e.g. {"ttft_ms_p99": 1000}."""
    families = list(dict.fromkeys(m.split("_")[0] for m in metrics))
    fig, axes = new_figure(1, len(families), size=(5.5 * len(families), 4.2))
    groups = list(sweep.groupby(hue, sort=True)) if hue else [(None, sweep)]
    styles = ("-", "--", ":", "-.")
    for g, (name, group) in enumerate(groups):
        group = group.sort_values(x)
        for metric in metrics:
            family = metric.split("_")[0]
            ax = axes[families.index(family)]
            same = [m for m in metrics if m.startswith(family + "_")]
            label = _metric_label(metric).split(" (")[0] + (f", {hue}={name}" if hue else "")
            ax.plot(group[x], group[metric], marker="o", ms=4, color=f"C{g}",
                    ls=styles[same.index(metric) % len(styles)], label=label)
    for ax, family in zip(axes, families):
        unit = next(_metric_label(m).split("(")[-1].rstrip(")") for m in metrics if m.startswith(family))
        for metric, target in (slo or {}).items():
            if metric.startswith(family + "_"):
                ax.axhline(target, color="red", ls="--", lw=1,
                           label=f"SLO: {_metric_label(metric).split(' (')[0]} <= {target:g} {unit}")
        ax.set_xlabel(_metric_label(x) if x != "rate" else "offered load (requests/s)")
        ax.set_ylabel(f"{family.upper()} ({unit})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return fig


def plot_spec_decode(results, bins: int = 120) -> Figure:
    """Speculative decoding: drafted vs accepted tokens per step over time, and the acceptance
    rate of each draft position (vLLM's per-position acceptance)."""
    fig, (top, bottom) = new_figure(2, 1, size=(10, 6.5))
    steps, s = results.steps, results.summary
    if steps.empty or "num_draft_tokens" not in steps:
        top.text(0.5, 0.5, "speculative decoding was off", ha="center", transform=top.transAxes)
        return fig
    edges, tokens = _binned(steps, ["num_draft_tokens", "num_accepted_tokens"], bins)
    top.stairs(tokens["num_draft_tokens"].to_numpy(), edges, fill=True, color=QUEUE, label="drafted")
    top.stairs(tokens["num_accepted_tokens"].to_numpy(), edges, fill=True, color=DECODE, label="accepted")
    top.set_ylabel("draft tokens per step\n(mean per time bin)")
    top.set_xlabel("simulated time (s)")
    top.set_title(f"Speculative decoding: acceptance rate {100 * s['spec_decode_acceptance_rate']:.1f}%, "
                  f"acceptance length {s['spec_decode_acceptance_length']:.2f}")
    top.legend(loc="upper right", fontsize=8)
    rates = {int(k.rsplit("_", 1)[1]): v for k, v in s.items() if k.startswith("spec_decode_acceptance_rate_pos_")}
    bottom.bar(list(rates), [100 * v for v in rates.values()], color=DECODE)
    bottom.set_xlabel("draft position")
    bottom.set_ylabel("accepted (% of drafts)")
    bottom.set_xticks(list(rates))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig


PLOTS = {
    "latency_cdf": plot_latency_cdfs,
    "kv_occupancy": plot_kv_occupancy,
    "batch_composition": plot_batch_composition,
    "queue_length": plot_queue_length,
    "timeline": plot_timeline,
}


def save_plots(results, directory: str | Path, fmt: str = "png", dpi: int = 120) -> list[Path]:
    """Write every plot of PLOTS (and `spec_decode` when it was on) for `results` into `directory` as
    <name>.<fmt>; returns the paths."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"fmt={fmt!r}: must be 'png' or 'svg'")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    plots = dict(PLOTS, spec_decode=plot_spec_decode) if "num_draft_tokens" in results.steps else PLOTS
    for name, make in plots.items():
        path = out / f"{name}.{fmt}"
        make(results).savefig(path, dpi=dpi)
        paths.append(path)
    return paths
