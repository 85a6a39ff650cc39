"""A run's per-step records read as columns: the summary reads them in place, and the per-step
DataFrame is built only when a user asks for it (a long run has millions of steps)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from sim.core.records import StepRecords, as_numpy


class StepTable:
    """Read-only columns of `StepRecords` (plus `kv_occupancy`), numpy views with no copy where the
    record is a typed array; `frame()` builds the DataFrame (int64/float64 columns) once."""

    def __init__(self, records: StepRecords, num_gpu_blocks: int):
        self._records = records
        self._num_gpu_blocks = num_gpu_blocks
        self._frame: pd.DataFrame | None = None

    def __len__(self) -> int:
        return len(self._records)

    @property
    def empty(self) -> bool:
        return not len(self._records)

    @property
    def columns(self) -> list[str]:
        return [*self._records.columns(), "kv_occupancy"]

    @property
    def built(self) -> bool:
        """Whether the DataFrame has been built."""
        return self._frame is not None

    def __getitem__(self, name: str) -> np.ndarray:
        if name == "kv_occupancy":
            return np.asarray(self["kv_blocks_used"], dtype=float) / self._num_gpu_blocks
        column = self._records.columns()[name]
        return np.frombuffer(column, dtype=column.typecode) if len(column) and hasattr(column, "typecode") \
            else np.asarray(column)

    def frame(self) -> pd.DataFrame:
        """The per-step DataFrame, as `Results.steps` has always had it."""
        if self._frame is None:
            steps = pd.DataFrame({k: as_numpy(v) for k, v in self._records.columns().items()})
            steps["kv_occupancy"] = steps["kv_blocks_used"] / self._num_gpu_blocks if len(steps) else []
            self._frame = steps
        return self._frame
