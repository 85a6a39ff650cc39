"""vLLM's data-parallel load balancing as the front end sees it: request counts published with a delay.

Each DP engine reports its (waiting, running) counts to the DP coordinator after a step, when they changed
(`DPEngineCoreProc._maybe_publish_request_counts`). The coordinator publishes the latest counts to the front
end at most once per `PUBLISH_INTERVAL_S` while they change, and every `IDLE_PUBLISH_INTERVAL_S` otherwise
(vllm/v1/engine/coordinator.py: `min_stats_update_interval_ms` = 100, the 4-second fallback). The front end
routes each request to the rank with the lowest 4 x waiting + running in the counts it last received (lowest
rank on ties) and counts the request as waiting there until the next publish replaces its counts
(`DPLBAsyncMPClient.get_core_engine_for_request`, one front end). So a rank that just freed seats is seen
only at the next publish.
"""
from __future__ import annotations

#: The coordinator's least time between two publishes while counts change (vLLM 0.19: 100 ms).
PUBLISH_INTERVAL_S = 0.1
#: Its time between publishes of unchanged counts (vLLM 0.19: 4 s); each one resets the front end's own
#: counts of the requests it routed since the last publish.
IDLE_PUBLISH_INTERVAL_S = 4.0


class DelayedLoadView:
    """The coordinator's latest reports and the front end's counts, advanced lazily to the time asked."""

    def __init__(self, ranks: int, start: float = 0.0):
        self.reported = [(0, 0)] * ranks         # per rank: (waiting, running) as last reported
        self.view = [[0, 0] for _ in range(ranks)]  # the front end's counts (published + its own routing)
        self.last_publish = start                 # the coordinator publishes at start-up
        self.changed_at: float | None = None      # first report since the last publish that changed counts

    def report(self, rank: int, waiting: int, running: int, now: float) -> None:
        """Rank `rank`'s counts after a step ending at `now` (the ranks of one lockstep step report at
        one instant: a publish due then takes all their reports)."""
        self._publish_due(now, at_now=False)
        counts = (waiting, running)
        if counts != self.reported[rank]:
            self.reported[rank] = counts
            if self.changed_at is None:
                self.changed_at = now

    def route(self, now: float) -> int:
        """The rank a request arriving at `now` goes to; it is counted as waiting there."""
        self._publish_due(now, at_now=True)
        view = self.view
        rank = min(range(len(view)), key=lambda i: (4 * view[i][0] + view[i][1], i))
        view[rank][0] += 1
        return rank

    def _publish_due(self, now: float, at_now: bool) -> None:
        """Make every publish due before `now` (`at_now`: or at it), in order."""
        while True:
            if self.changed_at is not None:
                due = max(self.changed_at, self.last_publish + PUBLISH_INTERVAL_S)
            else:
                due = self.last_publish + IDLE_PUBLISH_INTERVAL_S * max(
                    1, int((now - self.last_publish) // IDLE_PUBLISH_INTERVAL_S))
            if due > now or (due == now and not at_now):
                return
            self.view = [list(counts) for counts in self.reported]
            self.last_publish, self.changed_at = due, None
