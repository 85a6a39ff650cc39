"""Plots of a disaggregated run: KV occupancy per pool and the KV-transfer queue over time.

They take plain tables (a pool's steps with an `instance` column, the transfer queue samples), so
this layer needs nothing from sim.planning: `plot_pool_kv_occupancy({"prefill": out.pool_steps(
"prefill"), "decode": out.pool_steps("decode")}, blocks)`, `plot_transfer_queue(out.transfer_queue)`.
"""
from __future__ import annotations

import pandas as pd

from sim.plots.run_plots import DECODE, PREFILL, new_figure

POOL_COLOURS = {"prefill": PREFILL, "decode": DECODE}


def plot_pool_kv_occupancy(steps: dict[str, pd.DataFrame], num_gpu_blocks: dict[str, int]):
    """One panel per pool: each instance's used KV blocks / its blocks, at each step's end."""
    fig, axes = new_figure(len(steps), 1, size=(8, 2.6 * len(steps)), sharex=True)
    for ax, (pool, table) in zip(axes, steps.items()):
        for instance, rows in table.groupby("instance"):
            end = rows["start_time"] + rows["duration"]
            ax.step(end, rows["kv_blocks_used"] / num_gpu_blocks[pool], where="post", lw=0.8,
                    color=POOL_COLOURS.get(pool), alpha=0.5 + 0.5 / (1 + instance), label=f"{pool} {instance}")
        ax.set_ylim(0, 1.02)
        ax.set_ylabel(f"{pool} KV occupancy")
        ax.legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("simulated time (s)")
    return fig


def plot_transfer_queue(queue: pd.DataFrame):
    """KV transfers in flight (sharing the link) per prefill instance, over time."""
    fig, axes = new_figure()
    ax = axes[0]
    for source, rows in queue.groupby("source"):
        ax.step(rows["time"], rows["depth"], where="post", lw=0.8, label=f"prefill {source}")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV transfers in flight")
    if len(queue):
        ax.legend(loc="upper right", fontsize="small")
    return fig
