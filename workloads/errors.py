"""Errors for workload input files. Parameter errors use kernels_cost_model.errors.ConfigError."""
from __future__ import annotations

from pathlib import Path


class TraceFormatError(ValueError):
    """A trace file is malformed; names the file and the 1-based line at fault."""

    def __init__(self, path: str | Path, line: int, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{self.path}:{line}: {reason}")
