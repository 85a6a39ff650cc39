"""Writes tiny AIConfigurator attention tables (parquet) for reader tests."""
from __future__ import annotations

from pathlib import Path

import pytest


def write_attention_table(root: Path, system: str, table: str, batch: list, column: str, values: list) -> None:
    """`table`: "context" or "generation"; `column`: "isl" (context) or "step" (generation).
    Every row is a 32 x 8 x 128 BF16 layout with a latency of 0.1 ms."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    n = len(batch)
    path = root / "aiconfigurator" / system / "attention" / "vllm" / "0.24.0" / f"{table}_attention_perf.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"version": ["0.24.0"] * n, "batch_size": batch, column: values, "num_heads": [32] * n,
                             "num_key_value_heads": [8] * n, "head_dim": [128] * n,
                             "kv_cache_dtype": ["bfloat16"] * n, "window_size": [0] * n,
                             "latency": [0.1] * n}), path)
