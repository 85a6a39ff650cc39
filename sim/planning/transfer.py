"""KV transfers between instances over a priced link, queued when they overlap.

Each prefill instance sends over its own port group (one port per tensor-parallel rank, as vLLM's
NIXL connector moves each rank's KV shard in parallel). Transfers from one instance share that
port group first-come first-served: a transfer waits for the ones ahead of it, then takes
`link.transfer_time_s(bytes, lanes)`. The log keeps every transfer and the queue depth over time
(for the transfer-queue plot).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import simpy

from kernels_cost_model.links import Link


@dataclass
class TransferLog:
    """One row per transfer, and (time, instance, depth) samples of each port group's queue."""

    rows: list = field(default_factory=list)
    depth: list = field(default_factory=list)

    def transfers(self) -> pd.DataFrame:
        columns = ["request_id", "source", "destination", "num_bytes", "queued", "start", "end"]
        return pd.DataFrame(self.rows, columns=columns)

    def queue(self) -> pd.DataFrame:
        return pd.DataFrame(self.depth, columns=["time", "source", "depth"])


class PortGroup:
    """The ports one instance sends KV through: FIFO, one transfer at a time at full bandwidth."""

    def __init__(self, env: simpy.Environment, link: Link, lanes: int, index: int, log: TransferLog):
        self.env, self.link, self.lanes, self.index, self.log = env, link, lanes, index, log
        self.slot = simpy.Resource(env, capacity=1)
        self.num_queued = 0

    def send(self, request_id: str, destination: int, num_bytes: int, on_done) -> None:
        """Start a process that moves `num_bytes`, then calls `on_done(now)`."""
        self.env.process(self._send(request_id, destination, num_bytes, on_done))

    def _send(self, request_id: str, destination: int, num_bytes: int, on_done):
        env = self.env
        queued = env.now
        self._note(+1)
        with self.slot.request() as turn:
            yield turn
            start = env.now
            yield env.timeout(self.link.transfer_time_s(num_bytes, self.lanes))
        self._note(-1)
        self.log.rows.append((request_id, self.index, destination, num_bytes, queued, start, env.now))
        on_done(env.now)

    def _note(self, delta: int) -> None:
        self.num_queued += delta
        self.log.depth.append((self.env.now, self.index, self.num_queued))
