"""A progress line for long runs: simulated time and requests finished, on stderr.

The simulation calls `update(now)` once per finished request (no per-token cost). The line is
redrawn at most every `interval_s` of wall time and only once a run has lasted that long, so short
runs print nothing. Wall time only paces the display; it never touches simulated results.
"""
from __future__ import annotations

import sys
import time


class Progress:
    """`simulated 12.3 s | 450/1000 requests done` redrawn in place on `stream`."""

    def __init__(self, total: int | None = None, stream=None, interval_s: float = 0.5,
                 clock=time.monotonic):
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.clock = clock
        self.finished = 0
        self.now = 0.0
        self.started = clock()
        self.last_drawn = self.started
        self.drawn = False

    def update(self, now: float) -> None:
        """One more request finished at simulated time `now`."""
        self.finished += 1
        self.now = now
        wall = self.clock()
        if wall - self.last_drawn >= self.interval_s:
            self.last_drawn = wall
            self._draw()

    def line(self) -> str:
        """The current progress text."""
        done = f"{self.finished}/{self.total}" if self.total else str(self.finished)
        bar = ""
        if self.total:
            filled = int(20 * min(1.0, self.finished / self.total))
            bar = "[" + "#" * filled + "." * (20 - filled) + "] "
        return f"{bar}simulated {self.now:9.1f} s | {done} requests done"

    def _draw(self) -> None:
        self.stream.write("\r" + self.line())
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        """Finish the line (only if one was drawn)."""
        if self.drawn:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
