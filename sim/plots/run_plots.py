"""Plots of one run, as matplotlib Figures (across runs: `sim.plots.sweep`).

Figures are built with `matplotlib.figure.Figure` directly, not pyplot: no global figure state, and
`fig.savefig("x.png")` renders with the Agg backend whatever backend is active. Every function
returns the Figure; `save_plots` writes the standard set for one run.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kernels_cost_model.errors import is_int, require
from sim.api.itl import distinct_counts, itl_chunks, sorted_percentile

PREFILL, DECODE, QUEUE = "#e8743b", "#1f77b4", "#bbbbbb"
LATENCIES = (  # (per-request column or "itl", title)
    ("ttft_s", "TTFT (time to first token)"),
    ("tpot_s", "TPOT (time per output token, excl. first)"),
    ("itl", "ITL (inter-token latency)"),
    ("e2e_s", "E2E latency"),
)
CLIP_PERCENTILE = 99.9
"""CDF panels end at this percentile when larger values would squash the body; a note says so."""
SECONDS_FROM = 10.0
"""Latencies whose p99 reaches this many seconds are drawn in s, not ms."""


def new_figure(rows: int = 1, cols: int = 1, size=(8, 4.5), **kw):
    """A pyplot-free Figure with constrained layout and its axes, flattened."""
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, **kw)
    return fig, axes.ravel()


def legend_outside(ax, **kw) -> None:
    """The axes' legend to the right of the plot area, never over the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, **kw)


def time_unit(seconds) -> tuple[float, str]:
    """(scale, unit) for latencies in seconds: ms, or s once their p99 reaches SECONDS_FROM."""
    arr = np.asarray(seconds, dtype=float)
    arr = arr[~np.isnan(arr)]
    large = arr.size and np.percentile(arr, 99) >= SECONDS_FROM
    return (1.0, "s") if large else (1e3, "ms")


def _done(results) -> pd.DataFrame:
    return results.requests[results.requests["completed"].astype(bool)]


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def latency_counts(results, column: str) -> tuple[np.ndarray, np.ndarray, str]:
    """(sorted values in the unit, their counts, unit) of one latency panel, NaN dropped. Requests'
    columns: every value once. ITL: the distinct token gaps and how often each occurs (sim.api.itl),
    never the pooled gaps (hundreds of millions in a long run); in ms they equal the pooled gaps x 1e3
    bit for bit (in s, the rare panel whose p99 reaches SECONDS_FROM, within an ulp)."""
    if column == "itl":
        values, counts = distinct_counts(itl_chunks(results.token_times, results.requests["completed"].astype(bool)))
        large = len(values) and sorted_percentile(values, np.cumsum(counts), 99) >= SECONDS_FROM * 1e3
        return (values / 1e3, counts, "s") if large else (values, counts, "ms")
    values = _done(results)[column].to_numpy(dtype=float)
    values = np.sort(values[~np.isnan(values)])
    scale, unit = time_unit(values)
    return values * scale, np.ones(len(values), dtype=np.int64), unit


def cdf_points(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The vertices of the empirical CDF of sorted `values` with `counts`: the line through every
    value repeated (x = values one by one, y = 1/n .. n/n) less the points inside a vertical run,
    so it draws the same figure (a value seen once: one vertex; more often: its lowest and highest)."""
    cumulative = np.cumsum(counts)
    ranks = np.column_stack((cumulative - counts + 1, cumulative)).ravel()
    keep = np.ones(len(ranks), dtype=bool)
    keep[0::2] = counts > 1
    return np.repeat(values, 2)[keep], ranks[keep] / (cumulative[-1] if len(cumulative) else 1)


def plot_latency_cdfs(results) -> Figure:
    """Empirical CDFs of TTFT, TPOT, ITL and E2E latency over completed requests, p50/p99 marked.

    Each panel ends at p99.9 when the values beyond it would squash the body (a note gives how
    many and the largest); a panel whose p99 reaches 10 s is in seconds."""
    fig, axes = new_figure(2, 2, size=(10, 7))
    for ax, (column, title) in zip(axes, LATENCIES):
        values, counts, unit = latency_counts(results, column)
        ax.set_title(title)
        ax.set_xlabel(f"{title.split(' ')[0]} ({unit})")
        ax.set_ylabel("fraction of " + ("token gaps" if column == "itl" else "requests"))
        ax.grid(alpha=0.3)
        if not values.size:
            ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes)
            continue
        ax.plot(*cdf_points(values, counts), color=DECODE)
        cumulative = np.cumsum(counts)
        for q, style in ((50, ":"), (99, "--")):
            v = sorted_percentile(values, cumulative, q)
            ax.axvline(v, color="k", ls=style, lw=1, label=f"p{q} = {_fmt(v)} {unit}")
        _clip_tail(ax, values, cumulative, unit)
        ax.set_ylim(0, 1.01)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Latency distributions ({len(_done(results))} completed requests)")
    return fig


def tail_edge(values: np.ndarray, cumulative: np.ndarray) -> float:
    """numpy's percentile CLIP_PERCENTILE, method "lower" (a value not above it), of the multiset."""
    rank = math.floor((int(cumulative[-1]) - 1) * float(np.true_divide(CLIP_PERCENTILE, 100)))
    return float(values[np.searchsorted(cumulative, rank, "right")])


def _clip_tail(ax, values: np.ndarray, cumulative: np.ndarray, unit: str) -> None:
    """End the x axis at p99.9 when the largest value lies far beyond it, and say so on the plot."""
    edge, top = tail_edge(values, cumulative), values[-1]
    if top <= 1.5 * edge or edge <= 0:
        return
    beyond = int(cumulative[-1] - cumulative[np.searchsorted(values, edge, "right") - 1])
    ax.set_xlim(min(0.0, values[0]), edge * 1.02)
    ax.text(0.98, 0.5, f"x axis ends at p{CLIP_PERCENTILE:g}:\n{beyond} larger values\nup to {_fmt(top)} {unit}",
            transform=ax.transAxes, ha="right", va="center", fontsize=7, color="dimgrey")


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
    legend_outside(ax)
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
    require(is_int(bins) and bins >= 1, "bins", bins, "must be an integer >= 1")
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
    legend_outside(top)
    t = _step_ends(steps)
    bottom.plot(t, steps["num_running"], drawstyle="steps-post", color=DECODE, lw=1, label="running")
    bottom.plot(t, steps["num_waiting"], drawstyle="steps-post", color=PREFILL, lw=1, label="waiting")
    bottom.set_ylabel("requests")
    bottom.set_xlabel("simulated time (s)")
    legend_outside(bottom)
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
    scale, unit = time_unit(done["queueing_s"])
    bottom.scatter(done["arrival_time"], scale * done["queueing_s"], s=4, color=DECODE, alpha=0.6,
                   label="one dot per request,\nat its arrival time")
    legend_outside(bottom)
    bottom.set_ylabel(f"queueing delay ({unit})\n(arrival to first scheduled)")
    bottom.set_xlabel("simulated time (s)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig


def timeline_window(requests: pd.DataFrame, max_requests: int) -> tuple[pd.DataFrame, str]:
    """Up to `max_requests` consecutive requests (by arrival) showing what happened, and why these:
    the build-up to and the drain after the longest queueing delay, or the first ones if none waited."""
    ordered = requests.sort_values("arrival_time", kind="stable")
    if len(ordered) <= max_requests:
        return ordered, f"all {len(ordered)} requests"
    queueing = ordered["queueing_s"].fillna(0.0).to_numpy()
    if queueing.max() <= 0:
        return ordered.head(max_requests), f"first {max_requests} of {len(ordered)} requests (none queued)"
    peak = int(queueing.argmax())
    start = min(max(0, peak - (3 * max_requests) // 4), len(ordered) - max_requests)
    why = (f"{max_requests} of {len(ordered)} requests around the longest queueing delay "
           f"({_fmt(queueing[peak])} s, request {ordered['request_id'].iloc[peak]})")
    return ordered.iloc[start:start + max_requests], why


def plot_timeline(results, max_requests: int = 50) -> Figure:
    """Per-request Gantt chart (queued, prefill, decode) of a window of `max_requests` chosen by
    `timeline_window`; preempted requests outlined in red with their count, steps that preempted
    marked along the top."""
    require(is_int(max_requests) and max_requests >= 1, "max_requests", max_requests, "must be an integer >= 1")
    req, why = timeline_window(results.requests, max_requests)
    fig, (ax,) = new_figure(size=(10, max(3.0, 0.18 * len(req) + 1.5)))
    y = np.arange(len(req))
    phases = ((req["arrival_time"], req["first_scheduled_time"], QUEUE, "queued"),
              (req["first_scheduled_time"], req["first_token_time"], PREFILL, "prefill (to first token)"),
              (req["first_token_time"], req["finish_time"], DECODE, "decode"))
    for start, end, color, label in phases:
        width = (end - start).fillna(0).to_numpy(dtype=float)
        ax.barh(y, width, left=start.fillna(0).to_numpy(dtype=float), height=0.8, color=color, label=label)
    _mark_preemptions(ax, results.steps, req, y)
    ax.set_yticks(y, req["request_id"].astype(str), fontsize=6 if len(req) > 30 else 8)
    ax.set_ylim(len(req) - 0.5, -1.5)
    ax.set_xlabel("simulated time (s)")
    ax.set_title(f"Request timeline: {why}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    legend_outside(ax)
    return fig


def _mark_preemptions(ax, steps: pd.DataFrame, req: pd.DataFrame, y: np.ndarray) -> None:
    hit = req["num_preemptions"].to_numpy() > 0
    if hit.any():
        left = req["arrival_time"].to_numpy(dtype=float)[hit]
        right = req["finish_time"].fillna(req["arrival_time"]).to_numpy(dtype=float)[hit]
        ax.barh(y[hit], right - left, left=left, height=0.8, fill=False, edgecolor="red", lw=1,
                label="preempted (times shown)")
        for yy, x, n in zip(y[hit], right, req["num_preemptions"].to_numpy()[hit]):
            ax.text(x, yy, f" x{int(n)}", va="center", fontsize=6, color="red")
    lo, hi = float(req["arrival_time"].min()), float(req["finish_time"].max())
    at = _step_ends(steps)[(steps["num_preempted"].to_numpy() > 0)]
    at = at[(at >= lo) & (at <= hi)]
    if at.size:
        ax.scatter(at, np.full(at.size, -1.0), marker="v", color="red", s=12, label="step with a preemption")


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
    require(fmt in ("png", "svg"), "fmt", fmt, "must be 'png' or 'svg'")
    require(is_int(dpi) and dpi >= 1, "dpi", dpi, "must be an integer >= 1")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    plots = dict(PLOTS, spec_decode=plot_spec_decode) if "num_draft_tokens" in results.steps else PLOTS
    for name, make in plots.items():
        path = out / f"{name}.{fmt}"
        make(results).savefig(path, dpi=dpi)
        paths.append(path)
    return paths
