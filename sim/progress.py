"""A dependency-free text progress bar on stderr."""
from __future__ import annotations

import sys


class Progress:
    """`[#####.....] 50/100` redrawn in place; silent when disabled."""

    def __init__(self, total: int, enabled: bool = True, done: int = 0, width: int = 30, stream=None):
        self.total, self.done, self.width = total, done, width
        self.enabled, self.stream = enabled, stream or sys.stderr
        self.cached = done
        self._draw()

    def step(self, n: int = 1) -> None:
        before = self._filled()
        self.done += n
        if self._filled() != before or self.done == self.total:
            self._draw()

    def _filled(self) -> int:
        return int(self.width * self.done / self.total) if self.total else 0

    def _draw(self) -> None:
        if not self.enabled or not self.total:
            return
        filled = self._filled()
        note = f" ({self.cached} reused)" if self.cached else ""
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total}{note}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.total:
            self.stream.write("\n")
            self.stream.flush()
