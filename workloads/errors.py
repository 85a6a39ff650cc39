"""Errors for workload input files. Parameter errors use kernels_cost_model.errors.ConfigError."""
from __future__ import annotations

from pathlib import Path


class TraceFormatError(ValueError):
    """A trace file is malformed; names the file and the 1-based line at fault.

    `args` are the constructor's (path, line, reason), so `type(exc)(*exc.args)` (SimPy, pickle)
    rebuilds it with its message.
    """

    def __init__(self, path: str | Path, line: int, reason: str):
        super().__init__(str(path), line, reason)
        self.path, self.line, self.reason = str(path), line, reason

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"
