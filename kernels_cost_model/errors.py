"""Errors a user can act on: each names the field and the value at fault.

Every servesim exception keeps its constructor's arguments as `args`, so `type(exc)(*exc.args)`
rebuilds it intact: SimPy re-raises a failed process's exception that way, and pickle,
multiprocessing and Ray do the same when they carry it across processes. `is_int` / `is_number` are
the type tests every layer's checks share (no bool where a number belongs, no NaN or infinity).
"""
import json
import math
import os
from pathlib import Path

import numpy as np


class ConfigError(ValueError):
    """A configuration value is out of range or malformed."""

    def __init__(self, field: str, value: object, reason: str):
        super().__init__(field, value, reason)
        self.field, self.value, self.reason = field, value, reason

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.reason}"

    def __reduce__(self):
        return type(self), (self.field, picklable(self.value), self.reason)


class ShownAs(str):
    """A value that could not be pickled, kept as its repr (so the message reads the same)."""

    def __repr__(self) -> str:
        return str(self)


def picklable(value: object) -> object:
    """`value` itself if pickle can carry it, else its repr as a ShownAs."""
    import pickle
    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - any failure to pickle: keep the text instead
        return ShownAs(repr(value))
    return value


def is_int(value: object) -> bool:
    """An integer that is not a bool (True is an int to Python, not to a config); numpy integers count."""
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, np.integer)


def is_number(value: object) -> bool:
    """A finite int or float, bools excluded; numpy numbers count."""
    return (is_int(value) or isinstance(value, (float, np.floating))) and math.isfinite(value)


def require(condition: bool, field: str, value: object, reason: str) -> None:
    """Raise ConfigError(field, value, reason) unless `condition` holds."""
    if not condition:
        raise ConfigError(field, value, reason)


def require_path(field: str, value: object, what: str) -> Path:
    """`value` as a Path; a ConfigError naming `field` when it is not a path (None, a number, a list)."""
    require(isinstance(value, (str, os.PathLike)), field, value, f"must be a path to {what}")
    return Path(value)


def read_json_file(field: str, path: str | os.PathLike, what: str) -> object:
    """The JSON value in file `path`; a ConfigError naming `field` and the path, its reason starting with
    `what` ("cannot read config.json"), when the file cannot be read, is not UTF-8 text or not JSON."""
    try:
        return json.loads(Path(path).read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(field, str(path), f"{what}: not a text file (byte {exc.start} is not UTF-8)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(field, str(path), f"{what}: {exc}") from exc
