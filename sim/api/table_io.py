"""Tables on disk: typed round trips (CSV and Parquet) and writes that are never seen half done.

A saved table loads back identical, column types included: `save` records every column's dtype,
`load` restores it. Object columns (`stop_reason` holds token ids and stop strings, as vLLM's does)
are stored as JSON text per cell, so 7 and "7" stay apart. Every file is written to a temporary
name beside its destination and renamed into place, so an interrupted write leaves the old file or
the new one, never a truncated one.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from kernels_cost_model.errors import ConfigError

JSON_CELLS = "json"


def column_types(df: pd.DataFrame) -> dict[str, str]:
    """{column: dtype name}, with object columns marked as JSON-encoded."""
    return {name: JSON_CELLS if dtype == object else str(dtype) for name, dtype in df.dtypes.items()}


def encode(df: pd.DataFrame) -> pd.DataFrame:
    """A copy whose object columns are JSON text (null for None), ready for CSV or Parquet."""
    out = df.copy()
    for name, kind in column_types(df).items():
        if kind == JSON_CELLS:
            out[name] = pd.array([None if _missing(v) else json.dumps(_plain(v)) for v in df[name]], dtype="str")
    return out


def decode(df: pd.DataFrame, types: dict[str, str]) -> pd.DataFrame:
    """Undo `encode` and restore each column's recorded dtype."""
    out = {}
    for name, kind in types.items():
        column = df[name]
        if kind == JSON_CELLS:
            out[name] = pd.Series([None if _missing(v) else json.loads(v) for v in column], dtype=object)
        else:
            out[name] = column.astype(kind)
    return pd.DataFrame(out, index=pd.RangeIndex(len(df)))


def write_table(df: pd.DataFrame, path: Path, fmt: str) -> None:
    """Write `df` (encoded) to `path` as parquet or csv, atomically."""
    with atomic_path(path) as tmp:
        encoded = encode(df)
        if fmt == "parquet":
            encoded.to_parquet(tmp, index=False)
        else:
            encoded.to_csv(tmp, index=False)


def read_table(path: Path, fmt: str, types: dict[str, str] | None) -> pd.DataFrame:
    """Read a table `write_table` wrote; with `types` (recorded at save) the dtypes come back exact.
    A damaged table (unreadable, or without the columns `types` names) is a ConfigError naming the file."""
    path = Path(path)
    try:
        if fmt == "parquet":
            df = pd.read_parquet(path)
        elif types is None:
            df = pd.read_csv(path)
        else:
            text = {n: "str" for n, kind in types.items() if kind in (JSON_CELLS, "str", "object")}
            df = pd.read_csv(path, dtype=text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(path.name, str(path), f"not a table servesim wrote ({_first_line(exc)})") from None
    if types is None:
        return df
    missing = [name for name in types if name not in df.columns]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ConfigError(path.name, str(path), f"missing column(s) {missing[:5]}{more}")
    try:
        return decode(df, types)
    except (ValueError, TypeError) as exc:
        raise ConfigError(path.name, str(path),
                          f"a column does not hold its recorded type ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def write_text(path: Path, text: str) -> None:
    """Write a text file atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


@contextmanager
def atomic_path(path: Path):
    """A temporary path beside `path`, renamed onto it when the block succeeds, removed otherwise."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_output_folder(path: str | Path, what: str = "--out") -> Path:
    """Fail before a run, not after it, when `path` cannot become an output folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(what, str(path), "exists and is not a folder; choose a folder path")
    parent = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(what, str(path), f"cannot write there ({parent} is not a writable folder)")
    return path


def make_output_folder(path: str | Path, what: str = "--out") -> Path:
    """`path` checked as `check_output_folder` does, then created; a refusal (a read-only or virtual file
    system) is a ConfigError naming `what` and the path."""
    path = check_output_folder(path, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(what, str(path), f"cannot create folder: {exc.strerror or exc}") from None
    return path


def check_output_file(path: str | Path, what: str = "--out") -> Path:
    """Fail before the work, not after it, when `path` cannot be written as a file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(what, str(path), "is a folder; give a file path")
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(what, str(path), f"folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(what, str(path), f"cannot write there ({folder} is not a writable folder)")
    return path


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _plain(value):
    """numpy scalars as Python ones, so json can write them."""
    return value.item() if hasattr(value, "item") else value
