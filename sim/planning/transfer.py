"""KV transfers between instances over a priced link, sharing its bandwidth when they overlap.

Each instance's network interface is one port per GPU (tensor x pipeline ranks, as vLLM's NIXL
connector moves each rank's KV shard over its own NIC): a prefill instance can send at
`ranks x link bandwidth` in all, a decode instance receive at `ranks x link bandwidth` in all.
A transfer first pays the link's latency (no bandwidth used), then its bytes flow. Transfers in
flight share the interfaces by max-min fairness (processor sharing, as RDMA queue pairs share a
NIC): every transfer gets an equal share of its most contended interface (sender or receiver), and
a share one cannot use goes to the others. Rates are recomputed whenever a transfer starts, lands
or is cancelled. Alone, a transfer takes `link.transfer_time_s(bytes, lanes)` with lanes = the
smaller of the two instances' ranks; two overlapping on the same sender each take longer.

The log keeps every transfer (with its uncontended time) and the number in flight per sender
over time (for the transfer-queue plot).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import simpy

from kernels_cost_model.links import Link
from sim.core.invariants import InvariantError

_DONE_S = 1e-10   # a transfer whose remaining bytes need less than this at its rate has landed


@dataclass
class TransferLog:
    """One row per transfer, and (time, instance, depth) samples of each sender's transfers in flight."""

    rows: list = field(default_factory=list)
    depth: list = field(default_factory=list)

    def transfers(self) -> pd.DataFrame:
        columns = ["request_id", "source", "destination", "num_bytes", "queued", "start", "end", "alone_s"]
        return pd.DataFrame(self.rows, columns=columns)

    def queue(self) -> pd.DataFrame:
        return pd.DataFrame(self.depth, columns=["time", "source", "depth"])


class Flow:
    """One transfer: its bytes left, its current rate and what to call when it lands."""

    __slots__ = ("request_id", "source", "destination", "num_bytes", "remaining", "rate", "queued",
                 "alone_s", "on_done", "flowing", "cancelled")

    def __init__(self, request_id, source, destination, num_bytes, queued, alone_s, on_done):
        self.request_id, self.source, self.destination = request_id, source, destination
        self.num_bytes = self.remaining = float(num_bytes)
        self.queued, self.alone_s, self.on_done = queued, alone_s, on_done
        self.rate = 0.0
        self.flowing = self.cancelled = False


class LinkFabric:
    """Senders' and receivers' interfaces on one link kind; transfers share them max-min fairly."""

    def __init__(self, env: simpy.Environment, link: Link, source_ranks: list[int],
                 destination_ranks: list[int], log: TransferLog, shared: bool = True):
        """shared=False: every transfer moves at its rate alone, as if nothing else were on the link
        (a what-if for measuring contention, not a real network)."""
        self.env, self.link, self.log, self.shared = env, link, log, shared
        self.capacity = {**{("src", i): r * link.bytes_per_s for i, r in enumerate(source_ranks)},
                         **{("dst", d): r * link.bytes_per_s for d, r in enumerate(destination_ranks)}}
        self.ranks = (list(source_ranks), list(destination_ranks))
        self.flows: list[Flow] = []          # flowing, in the order they started
        self.num_in_flight = [0] * len(source_ranks)
        self.updated = env.now
        self.generation = 0

    def send(self, request_id: str, source: int, destination: int, num_bytes: int, on_done) -> Flow:
        """Start moving `num_bytes` from sender `source` to receiver `destination`; `on_done(now)` when
        they have landed (never if cancelled first)."""
        lanes = min(self.ranks[0][source], self.ranks[1][destination])
        flow = Flow(request_id, source, destination, num_bytes, self.env.now,
                    self.link.transfer_time_s(num_bytes, lanes), on_done)
        self._note(source, +1)
        delay = self.link.latency_s if num_bytes > 0 else 0.0
        self.env.timeout(delay).callbacks.append(lambda _e: self._start(flow))
        return flow

    def cancel(self, flow: Flow) -> None:
        """Stop `flow` now; its share goes to the others at once. Nothing is logged for it."""
        if flow.cancelled:
            return
        flow.cancelled = True
        self._note(flow.source, -1)
        if flow.flowing:
            self._advance()
            self.flows.remove(flow)
            self._reschedule()

    # ----- the bandwidth shares ---------------------------------------------------------------------
    def _start(self, flow: Flow) -> None:
        if flow.cancelled:
            return
        if flow.remaining <= 0:
            return self._land(flow)
        self._advance()
        flow.flowing = True
        self.flows.append(flow)
        self._reschedule()

    def _advance(self) -> None:
        """Move every flowing transfer's bytes on to now at its current rate."""
        elapsed = self.env.now - self.updated
        if elapsed > 0:
            for f in self.flows:
                f.remaining -= f.rate * elapsed
        self.updated = self.env.now

    def _reschedule(self) -> None:
        """New max-min fair rates; wake when the first of the flowing transfers lands."""
        self.generation += 1
        if not self.flows:
            return
        if self.shared:
            share_fairly(self.flows, self.capacity)
            self._check_capacity()
        else:
            for f in self.flows:
                f.rate = min(self.capacity[("src", f.source)], self.capacity[("dst", f.destination)])
        wait = max(0.0, min(f.remaining / f.rate for f in self.flows))
        generation = self.generation
        self.env.timeout(wait).callbacks.append(lambda _e: self._tick(generation))

    def _tick(self, generation: int) -> None:
        if generation != self.generation:
            return                     # rates changed since this wake-up was planned
        self._advance()
        landed = [f for f in self.flows if f.remaining <= f.rate * _DONE_S]
        if not landed:                 # rounding: the transfer this wake-up was planned for lands
            landed = [min(self.flows, key=lambda f: f.remaining / f.rate)]
        self.flows = [f for f in self.flows if f not in landed]
        self._reschedule()
        for f in landed:
            self._land(f)

    def _land(self, flow: Flow) -> None:
        self._note(flow.source, -1)
        self.log.rows.append((flow.request_id, flow.source, flow.destination, int(flow.num_bytes),
                              flow.queued, flow.queued, self.env.now, flow.alone_s))
        flow.on_done(self.env.now)

    def _check_capacity(self) -> None:
        load: dict = {}
        for f in self.flows:
            for port in (("src", f.source), ("dst", f.destination)):
                load[port] = load.get(port, 0.0) + f.rate
        for port, rate in load.items():
            if rate > self.capacity[port] * (1 + 1e-9):
                raise InvariantError(f"KV transfers through {port} at {rate:.4g} B/s, over its "
                                     f"{self.capacity[port]:.4g} B/s")

    def _note(self, source: int, delta: int) -> None:
        self.num_in_flight[source] += delta
        self.log.depth.append((self.env.now, source, self.num_in_flight[source]))


def share_fairly(flows: list[Flow], capacity: dict) -> None:
    """Max-min fair rates (progressive filling): repeatedly the most contended interface splits what
    it has left equally among its unfixed transfers, which are then fixed at that rate."""
    left = dict(capacity)
    unfixed = list(flows)
    while unfixed:
        users: dict = {}
        for f in unfixed:
            for port in (("src", f.source), ("dst", f.destination)):
                users.setdefault(port, []).append(f)
        share = min(left[p] / len(fs) for p, fs in users.items())
        bottlenecks = [p for p, fs in users.items() if left[p] / len(fs) <= share * (1 + 1e-12)]
        fixed = {id(f): f for p in bottlenecks for f in users[p]}
        for f in fixed.values():
            f.rate = share
            for port in (("src", f.source), ("dst", f.destination)):
                left[port] = max(0.0, left[port] - share)
        unfixed = [f for f in unfixed if id(f) not in fixed]
