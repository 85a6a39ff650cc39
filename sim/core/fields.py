"""Strict field checks shared by every config section and spec: one place that says what a value may be.

Types come from each dataclass field's annotation ("int", "float | None", "bool", "str"): no bool
where an int belongs (`seed = true`), no string where a bool belongs (`enable_prefix_caching =
"false"`), no NaN or infinity where a number belongs. Ranges are checked by `at_least` / `within`.
numpy scalars (a sweep built with np.arange) count as the Python numbers they hold.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from kernels_cost_model.errors import ConfigError, is_int, is_number  # noqa: F401 - re-exported

MAX_TOKEN_ID = 2**31 - 1
"""Token ids are int32 (prompt arrays and KV hashes store them so)."""
MAX_NUM_REQUESTS = 10_000_000
"""Largest run: per-request records of more would not fit in a typical machine's memory."""

_KINDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def _matches(kind: str, value: object) -> bool:
    if kind == "int":
        return is_int(value)
    if kind == "float":
        return is_number(value)
    if kind == "bool":
        return isinstance(value, bool)
    return isinstance(value, str)


def check_types(obj, prefix: str = "") -> None:
    """ConfigError unless every simple field of dataclass `obj` holds a value of its annotated type.

    Fields annotated with other types (sections, tuples, objects) are left to their own checks. A numpy
    scalar that passes is stored as the Python number it holds (so the config dumps as plain JSON).
    """
    for f in dataclasses.fields(obj):
        kinds = [k.strip() for k in str(f.type).split("|")]
        optional = "None" in kinds
        kinds = [k for k in kinds if k != "None"]
        if len(kinds) != 1 or kinds[0] not in _KINDS:
            continue
        value = getattr(obj, f.name)
        if value is None and optional:
            continue
        if not _matches(kinds[0], value):
            what = _KINDS[kinds[0]] + (" or null (unset)" if optional else "")
            raise ConfigError(prefix + f.name, value, f"must be {what}")
        if isinstance(value, np.generic):
            object.__setattr__(obj, f.name, value.item())


def at_least(field: str, value, low, *, optional: bool = False) -> None:
    """ConfigError unless value >= low (None passes when `optional`)."""
    if value is None and optional:
        return
    if not value >= low:
        raise ConfigError(field, value, f"must be {'an integer ' if is_int(low) else ''}>= {low}")


def in_range(field: str, value, low, high, *, optional: bool = False, why: str = "") -> None:
    """ConfigError unless low <= value <= high (None passes when `optional`)."""
    if value is None and optional:
        return
    if not low <= value <= high:
        raise ConfigError(field, value, f"must be in [{low}, {high}]" + (f" ({why})" if why else ""))


def positive(field: str, value, *, optional: bool = False) -> None:
    """ConfigError unless value > 0 (None passes when `optional`)."""
    if value is None and optional:
        return
    if not value > 0:
        raise ConfigError(field, value, "must be > 0")


def one_of(field: str, value, choices) -> None:
    """ConfigError unless value is one of `choices`."""
    if value not in tuple(choices):
        raise ConfigError(field, value, f"must be one of {tuple(choices)}")


MAX_SECONDS = 1e9
"""Longest time-like setting (a think time, an SLO): beyond it a float clock no longer resolves
microseconds and step durations would vanish in rounding."""
MAX_ARRIVAL_S = 1e10
"""Latest time a request may arrive (or be aborted at): a closed loop's think times of up to
MAX_SECONDS add up beyond MAX_SECONDS; at 1e10 s the clock still resolves 2 µs, a thousandth of a short
step (at 1e15 s every latency rounded to 0)."""
