"""Streaming trace readers: one TraceRow per line, never the whole file in memory.

Formats (`read_trace(path, format)`; format inferred from the header when None):
  azure     Azure LLM inference trace: TIMESTAMP (wall clock, 7 fractional digits, optional
            +00:00), ContextTokens, GeneratedTokens. CRLF lines are fine.
  mooncake  Mooncake FAST'25 JSONL: timestamp (ms), input_length, output_length, hash_ids
            (one id per 512-token prompt block; equal ids = equal prefix blocks).
  burstgpt  BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens, Total tokens,
            Log Type. Model becomes the tenant.
  generic   CSV or JSONL: arrival_s, prompt_tokens, output_tokens; optional session_id, tenant,
            priority, prefix_id + prefix_tokens (requests with the same prefix_id share their
            first prefix_tokens tokens) and, JSONL only, hash_ids (+ block_size, default 512).
Times are seconds since the first row. Errors name the file and line (TraceFormatError).
"""
from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from kernels_cost_model.errors import ConfigError, require, require_path
from workloads.errors import TraceFormatError


MAX_TRACE_TOKENS = 2**24
"""Longest prompt or output a trace row may give: above any model's context (Llama 3.1: 131072)."""
MAX_TRACE_SECONDS = 1e9
"""Latest arrival, relative to the first row: the simulated clock keeps microseconds up to here."""


class TraceRow(NamedTuple):
    """One trace request; arrival_s is relative to the trace's first row."""

    line: int
    arrival_s: float
    prompt_len: int
    output_len: int
    hash_ids: tuple[int, ...] | None = None
    block_size: int = 512
    session_id: str | None = None
    tenant: str | None = None
    priority: int = 0
    prefix_id: str | None = None
    prefix_len: int = 0


_LINE_ENDS = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?")
_EPOCH = datetime(1970, 1, 1)


def parse_wall_clock(text: str) -> tuple[int, float]:
    """'2023-11-16 18:17:03.9799600[+00:00]' -> (whole UTC seconds since 1970, fraction)."""
    m = _TIMESTAMP.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"bad timestamp {text!r}")
    dt = datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3] or ""))
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return int((dt - _EPOCH).total_seconds()), float(m[2] or 0.0)


class _Clock:
    """Rebases times to the first row and rejects times going backwards; `column` names the time column."""

    def __init__(self, path: Path, column: str):
        self.path, self.column, self.first, self.last = path, column, None, float("-inf")

    def rebase(self, line: int, whole: float, frac: float = 0.0) -> float:
        if self.first is None:
            self.first = (whole, frac)
        t = (whole - self.first[0]) + (frac - self.first[1])
        if t > MAX_TRACE_SECONDS:
            raise TraceFormatError(self.path, line, f"{self.column} {t:.6g} s after the first row; at most"
                                   f" {MAX_TRACE_SECONDS:g} s (a float clock loses microseconds beyond)")
        if t < self.last:
            raise TraceFormatError(self.path, line, f"{self.column} goes backwards: {self.last - t:.6g} s before the"
                                   " previous row's; a trace's rows must be sorted by arrival time")
        self.last = t
        return t


def _int(value, path: Path, line: int, name: str, minimum: int, maximum: int = MAX_TRACE_TOKENS) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TraceFormatError(path, line, f"{name}={value!r} is not a number") from None
    if not math.isfinite(number) or number != int(number) or number < minimum:
        raise TraceFormatError(path, line, f"{name}={value!r} must be an integer >= {minimum}")
    if number > maximum:
        raise TraceFormatError(path, line, f"{name}={value!r} must be at most {maximum}")
    return int(number)


def _json_int(value, path: Path, line: int, name: str, minimum: int, maximum: int = MAX_TRACE_TOKENS) -> int:
    """_int of a JSON field, which must be a JSON number (not a string or true/false)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceFormatError(path, line, f"{name}={json.dumps(value)} must be a JSON integer")
    return _int(value, path, line, name, minimum, maximum)


def _text_lines(path: Path) -> Iterator[str]:
    """The file's lines as text; a line that is not UTF-8 is a TraceFormatError naming it."""
    with path.open("rb") as f:
        pieces = (piece for raw in f for piece in _LINE_ENDS.findall(raw))  # \r alone ends a line too
        for line, raw in enumerate(pieces, 1):
            try:
                yield raw.decode("utf-8-sig" if line == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise TraceFormatError(path, line, f"not UTF-8 text (byte {raw[exc.start]:#04x})") from None


def _csv_rows(path: Path, required: list[str]) -> Iterator[tuple[int, dict]]:
    reader = csv.DictReader(_text_lines(path), skipinitialspace=True)
    try:
        if reader.fieldnames is None:
            raise TraceFormatError(path, 1, f"empty file: expected a header row with columns {required}")
        missing = [c for c in required if c not in reader.fieldnames]
        if missing:
            raise TraceFormatError(path, 1, f"missing column(s) {missing}; header is {reader.fieldnames}")
        for row in reader:
            if None in row or any(value is None for value in row.values()):
                raise TraceFormatError(path, reader.line_num, f"{len(reader.fieldnames)} columns expected")
            yield reader.line_num, row
    except csv.Error as exc:
        raise TraceFormatError(path, max(reader.line_num, 1), f"not valid CSV: {exc}") from None


def _jsonl_rows(path: Path, required: list[str]) -> Iterator[tuple[int, dict]]:
    for line, text in enumerate(_text_lines(path), 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceFormatError(path, line, f"invalid JSON: {e.msg}") from None
        except RecursionError:
            raise TraceFormatError(path, line, "invalid JSON: nested too deeply") from None
        if not isinstance(row, dict):
            raise TraceFormatError(path, line, "each line must be a JSON object")
        missing = [c for c in required if c not in row]
        if missing:
            raise TraceFormatError(path, line, f"missing field(s) {missing}")
        yield line, row


def read_azure(path: str | Path) -> Iterator[TraceRow]:
    """Azure LLM inference trace (2023 or 2024 CSV)."""
    path, clock = Path(path), _Clock(Path(path), "TIMESTAMP")
    for line, row in _csv_rows(path, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]):
        try:
            whole, frac = parse_wall_clock(row["TIMESTAMP"])
        except ValueError as e:
            raise TraceFormatError(path, line, str(e)) from None
        yield TraceRow(line, clock.rebase(line, whole, frac),
                       _int(row["ContextTokens"], path, line, "ContextTokens", 1),
                       _int(row["GeneratedTokens"], path, line, "GeneratedTokens", 0))


def read_mooncake(path: str | Path) -> Iterator[TraceRow]:
    """Mooncake FAST'25 JSONL trace with 512-token prefix block hash ids."""
    path, clock = Path(path), _Clock(Path(path), "timestamp")
    for line, row in _jsonl_rows(path, ["timestamp", "input_length", "output_length", "hash_ids"]):
        yield _hashed_row(path, line, row, clock.rebase(line, _number(row["timestamp"], path, line) / 1000),
                          ("input_length", "output_length"), 512)


def read_burstgpt(path: str | Path) -> Iterator[TraceRow]:
    """BurstGPT CSV; rows with 0 response tokens (failed requests) come through as output_len 0."""
    path, clock = Path(path), _Clock(Path(path), "Timestamp")
    for line, row in _csv_rows(path, ["Timestamp", "Model", "Request tokens", "Response tokens"]):
        yield TraceRow(line, clock.rebase(line, _number(row["Timestamp"], path, line)),
                       _int(row["Request tokens"], path, line, "Request tokens", 1),
                       _int(row["Response tokens"], path, line, "Response tokens", 0),
                       tenant=row["Model"] or None)


GENERIC_REQUIRED = ["arrival_s", "prompt_tokens", "output_tokens"]


def read_generic(path: str | Path) -> Iterator[TraceRow]:
    """The documented generic schema, CSV or JSONL (by file suffix)."""
    path, clock = Path(path), _Clock(Path(path), "arrival_s")
    jsonl = path.suffix in (".jsonl", ".json", ".ndjson")
    rows = (_jsonl_rows if jsonl else _csv_rows)(path, GENERIC_REQUIRED)
    for line, row in rows:
        t = clock.rebase(line, _number(row["arrival_s"], path, line))
        opt = lambda key: row.get(key) if row.get(key) not in ("", None) else None
        integer = _json_int if jsonl else _int
        text = lambda key: _str(opt(key), path, line, key)
        extra = dict(session_id=text("session_id"), tenant=text("tenant"),
                     priority=integer(opt("priority") or 0, path, line, "priority", -2**31, 2**31 - 1),
                     prefix_id=text("prefix_id"),
                     prefix_len=integer(opt("prefix_tokens") or 0, path, line, "prefix_tokens", 0))
        if jsonl and row.get("hash_ids") is not None:
            block = _json_int(row.get("block_size", 512), path, line, "block_size", 1, 2**16)
            yield _hashed_row(path, line, row, t, ("prompt_tokens", "output_tokens"), block)._replace(**extra)
            continue
        yield TraceRow(line, t, integer(row["prompt_tokens"], path, line, "prompt_tokens", 1),
                       integer(row["output_tokens"], path, line, "output_tokens", 0), **extra)


def _hashed_row(path: Path, line: int, row: dict, t: float, keys: tuple[str, str], block: int) -> TraceRow:
    """A JSONL row with hash_ids; keys name its prompt and output token counts."""
    p, o = (_json_int(row[key], path, line, key, minimum) for key, minimum in zip(keys, (1, 0)))
    ids = row["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**64
                                            for h in ids):
        raise TraceFormatError(path, line, "hash_ids must be a list of integers in [0, 2**64)")
    if len(ids) * block < p:
        raise TraceFormatError(path, line, f"{len(ids)} hash_ids of {block} tokens cannot cover {p} tokens")
    return TraceRow(line, t, p, o, tuple(ids[:-(-p // block)]), block)  # the blocks the prompt uses


def _number(value, path: Path, line: int) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TraceFormatError(path, line, f"timestamp {value!r} is not a number") from None
    if not math.isfinite(number) or isinstance(value, bool):
        raise TraceFormatError(path, line, f"timestamp {value!r} is not a finite number")
    return number


def _str(value, path: Path, line: int, name: str) -> str | None:
    if isinstance(value, (dict, list)):
        raise TraceFormatError(path, line, f"{name}={value!r} must be a string or a number")
    return None if value is None else str(value)


READERS: dict[str, Callable[[Path], Iterator[TraceRow]]] = {
    "azure": read_azure, "mooncake": read_mooncake, "burstgpt": read_burstgpt, "generic": read_generic}


def detect_format(path: str | Path) -> str:
    """Guess a trace's format from its first line."""
    path = Path(path)
    head = next(_text_lines(path), "")
    if "TIMESTAMP" in head and "ContextTokens" in head:
        return "azure"
    if "Request tokens" in head and "Response tokens" in head:
        return "burstgpt"
    if head.lstrip().startswith("{") and '"hash_ids"' in head and '"input_length"' in head:
        return "mooncake"
    return "generic"


def require_trace_file(field: str, value) -> Path:
    """`value` as the Path of a regular file; else a ConfigError naming `field`: not found, a folder, or
    not a regular file (a device, a pipe: a trace is read twice when it is rescaled)."""
    path = require_path(field, value, "a trace file")
    if not path.is_file():
        reason = ("is a folder, not a trace file" if path.is_dir() else
                  "is not a regular file (a device or a pipe); give a trace file" if path.exists() else
                  "trace file not found")
        if not path.is_absolute() and not path.exists():  # (a TOML file's relative path is read from the cwd)
            reason += f" (relative paths are read from the current folder, {Path.cwd()})"
        raise ConfigError(field, str(value), reason)
    return path


def read_trace(path: str | Path, format: str | None = None) -> Iterator[TraceRow]:
    """Stream the rows of a trace file of `format` (inferred when None)."""
    path = require_trace_file("path", path)
    fmt = format or detect_format(path)
    require(fmt in READERS, "format", fmt, f"must be one of {sorted(READERS)}")
    return _at_least_one(READERS[fmt](path), path)


def _at_least_one(rows: Iterator[TraceRow], path: Path) -> Iterator[TraceRow]:
    """The rows, and a TraceFormatError at the end when there were none (a run of 0 requests says nothing)."""
    empty = True
    for row in rows:
        empty = False
        yield row
    if empty:
        raise TraceFormatError(path, 1, "no requests: the file has no data rows")
