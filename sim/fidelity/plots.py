"""Comparison plots: latency CDFs side by side, running/waiting over time side by side."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

LABELS = {"ttft_s": "TTFT (s)", "tpot_s": "TPOT (ms)", "e2e_s": "E2E latency (s)"}
SCALE = {"ttft_s": 1.0, "tpot_s": 1e3, "e2e_s": 1.0}


def _cdf(ax, values, label: str, style: str) -> None:
    v = np.sort(np.asarray(values, float)[~np.isnan(values)])
    ax.plot(v, np.arange(1, len(v) + 1) / len(v), style, label=label, lw=1.8)


def latency_cdfs(sim: pd.DataFrame, real: pd.DataFrame, title: str, path: Path) -> Path:
    """One panel per latency: the measured CDF and the simulated one."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, m in zip(axes, LABELS):
        _cdf(ax, real[m].to_numpy(float) * SCALE[m], "real vLLM", "k-")
        _cdf(ax, sim[m].to_numpy(float) * SCALE[m], "servesim", "C1--")
        ax.set_xlabel(LABELS[m])
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle(f"{title}: latency CDFs (300 requests)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def queues_over_time(sim: pd.DataFrame, real: pd.DataFrame, title: str, path: Path) -> Path:
    """Running and waiting requests per second: measured (left) and simulated (right), same axes."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 3.8), sharey=True)
    top = max(real[["running", "waiting"]].to_numpy().max(), sim[["running", "waiting"]].to_numpy().max())
    for ax, df, name in ((axes[0], real, "real vLLM"), (axes[1], sim, "servesim")):
        ax.plot(df["t"], df["running"], "C0-", label="running", lw=1.8)
        ax.plot(df["t"], df["waiting"], "C3-", label="waiting", lw=1.8)
        ax.set_title(name)
        ax.set_xlabel("time since first request (s)")
        ax.set_ylim(0, top * 1.08 + 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")
    axes[0].set_ylabel("requests")
    fig.suptitle(f"{title}: running / waiting requests per second")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
