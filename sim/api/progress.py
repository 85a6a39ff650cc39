"""A progress line for long runs on stderr: items done, and simulated time where there is one.

Callers call `update(now)` once per finished item (a request: no per-token cost; a sweep run).
The line is redrawn at most every `interval_s` of wall time and only once a run has lasted that
long, so short runs print nothing. Wall time only paces the display; it never touches results.
"""
from __future__ import annotations

import sys
import time


class Progress:
    """`[####......] simulated 12.3 s | 450/1000 requests done` redrawn in place on `stream`.

    unit: what is counted ("requests", "runs"); done: items already finished before the start
    (shown as reused, e.g. sweep results found on disk); enabled: False draws nothing.
    """

    def __init__(self, total: int | None = None, stream=None, interval_s: float = 0.5,
                 clock=time.monotonic, *, unit: str = "requests", done: int = 0, enabled: bool = True):
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.clock = clock
        self.unit = unit
        self.finished = self.reused = done
        self.enabled = enabled
        self.now: float | None = None
        self.last_drawn = clock()
        self.drawn = False

    def update(self, now: float | None = None) -> None:
        """One more item finished (at simulated time `now`, if it has one)."""
        self.finished += 1
        if now is not None:
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
        sim = f"simulated {self.now:9.1f} s | " if self.now is not None else ""
        reused = f" ({self.reused} reused)" if self.reused else ""
        return f"{bar}{sim}{done} {self.unit} done{reused}"

    def _draw(self) -> None:
        if not self.enabled:
            return
        self.stream.write("\r" + self.line())
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        """Finish the line (only if one was drawn)."""
        if self.drawn:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
