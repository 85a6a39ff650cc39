"""The measured-profile CSV schema: one row per kernel measurement.

Columns (blank where an operator does not use one):

| column | meaning |
|---|---|
| operator | qkv_proj, o_proj, mlp_up, mlp_down, lm_head, moe_router, matmul, rms_norm, add_rms_norm, silu_mul, rope, add, embedding, prefill_attention, decode_attention, all_reduce, moe |
| m, n, k | matmul [m x k] @ [k x n]; elementwise ops use m (tokens) and n (width) |
| batch, chunk, context | attention: requests, new tokens per request, cached tokens per request |
| num_heads, num_kv_heads, head_dim | attention heads on this GPU |
| tp, size_bytes | all-reduce: GPUs in the group and message bytes |
| num_experts, top_k | moe: experts on this GPU and experts per token (m tokens, n hidden, k intermediate per GPU) |
| routing | moe: how the measurement routed tokens: blank (uniform random) or balanced (spread evenly over the experts) |
| dtype | float16, bfloat16, float32, float8 |
| measured_s | measured seconds (one kernel call), in [1e-9, 3600] |
| device | the GPU catalog name, or e.g. "cpu" |
| source | where the measurement came from (file, tool, commit) |
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Iterable

from kernels_cost_model.errors import ConfigError, require_path

from .roofline import OPERATOR_FAMILY

COLUMNS = ("operator", "m", "n", "k", "batch", "chunk", "context", "num_heads", "num_kv_heads",
           "head_dim", "tp", "size_bytes", "num_experts", "top_k", "dtype", "measured_s", "device", "source",
           "routing")
#: MoE `routing` values: uniform random (blank) or AIConfigurator's balanced distribution.
ROUTINGS = ("", "balanced")
NUMERIC = ("m", "n", "k", "batch", "chunk", "context", "num_heads", "num_kv_heads", "head_dim",
           "tp", "size_bytes", "num_experts", "top_k")
MIN_MEASURED_S, MAX_MEASURED_S = 1e-9, 3600.0
"""Range of one kernel call's time (s): no launch takes under a nanosecond, none an hour; outside it a
value is a unit slip (ns or ms read as s), and the fit's linear algebra would not converge."""
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}
REQUIRED = {
    "matmul": ("m", "n", "k"),
    "elementwise": ("m", "n"),
    "prefill_attention": ("chunk", "batch", "num_heads", "num_kv_heads", "head_dim"),
    "decode_attention": ("context", "batch", "num_heads", "num_kv_heads", "head_dim"),
    "decode_attention_l2": ("context", "batch", "num_heads", "num_kv_heads", "head_dim"),
    "prefill_attention_l2": ("chunk", "batch", "num_heads", "num_kv_heads", "head_dim"),
    "all_reduce": ("size_bytes", "tp"),
    "moe": ("m", "n", "k", "num_experts", "top_k"),
}


def _fail(origin: str, line: int, column: str, value: object, reason: str) -> ConfigError:
    return ConfigError(f"{origin}:{line}:{column}", value, reason)


def validate_row(raw: dict, origin: str = "<profile>", line: int = 0) -> dict:
    """Check one raw row and return it typed: numbers as floats, plus `family` and `dtype_bytes`."""
    op = str(raw.get("operator") or "").strip()
    if op not in OPERATOR_FAMILY:
        raise _fail(origin, line, "operator", op, f"unknown operator; expected one of {sorted(OPERATOR_FAMILY)}")
    family = OPERATOR_FAMILY[op]
    row: dict = {"operator": op, "family": family}
    for col in NUMERIC:
        text = raw.get(col)
        text = "" if text is None else str(text).strip()
        if text in ("", "nan"):
            if col in REQUIRED[family]:
                raise _fail(origin, line, col, text, f"required for operator {op}")
            row[col] = 0.0
            continue
        try:
            value = float(text)
        except ValueError:
            raise _fail(origin, line, col, text, "not a number") from None
        if not math.isfinite(value) or value < 0:
            raise _fail(origin, line, col, text, "must be a finite number >= 0")
        row[col] = value
    if family == "prefill_attention" and row["chunk"] < 1:
        raise _fail(origin, line, "chunk", raw.get("chunk"), "must be >= 1")
    dtype = str(raw.get("dtype") or "").strip()
    if dtype not in DTYPE_BYTES:
        raise _fail(origin, line, "dtype", dtype, f"expected one of {sorted(DTYPE_BYTES)}")
    row["dtype"], row["dtype_bytes"] = dtype, DTYPE_BYTES[dtype]
    try:
        row["measured_s"] = float(raw.get("measured_s"))
    except (TypeError, ValueError):
        raise _fail(origin, line, "measured_s", raw.get("measured_s"), "not a number") from None
    if not MIN_MEASURED_S <= row["measured_s"] <= MAX_MEASURED_S:
        raise _fail(origin, line, "measured_s", raw.get("measured_s"),
                    f"must be a number of seconds in [{MIN_MEASURED_S:g}, {MAX_MEASURED_S:g}]")
    row["device"] = str(raw.get("device") or "").strip()
    if not row["device"]:
        raise _fail(origin, line, "device", row["device"], "required")
    row["source"] = str(raw.get("source") or "").strip()
    row["routing"] = str(raw.get("routing") or "").strip()
    if row["routing"] not in ROUTINGS:
        raise _fail(origin, line, "routing", row["routing"], "expected blank (uniform random) or 'balanced'")
    return row


def read_profile(path: str | Path) -> list[dict]:
    """Read and validate a profile CSV; errors name the file, line and column."""
    path = require_path("profile", path, "a profile CSV file")
    if not path.is_file():
        reason = "is a folder, not a profile CSV file" if path.is_dir() else "no such file"
        raise ConfigError("profile", str(path), reason)
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in ("operator", "dtype", "measured_s", "device") if c not in (reader.fieldnames or [])]
            if missing:
                raise ConfigError("profile", str(path), f"header lacks columns {missing}; expected {list(COLUMNS)}")
            rows = [validate_row(raw, str(path), i) for i, raw in enumerate(reader, start=2)]
    except UnicodeDecodeError as exc:
        raise ConfigError("profile", str(path), f"not a text file (byte {exc.start} is not UTF-8)") from None
    if not rows:
        raise ConfigError("profile", str(path), "no measurement rows")
    return rows


def write_profile(rows: Iterable[dict], path: str | Path) -> Path:
    """Write rows (dicts with any subset of COLUMNS) as a profile CSV."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _fmt(row.get(c, "")) for c in COLUMNS})
    return path


def _fmt(value: object) -> object:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value
