"""Shared helpers for the CSV catalogs: name normalisation and alias lookup."""
from __future__ import annotations

import csv
import json
from importlib import resources
from typing import Iterable

from .errors import ConfigError


def normalise(name: str) -> str:
    """Case-insensitive key: lower case, spaces and underscores read as dashes."""
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def read_catalog(filename: str) -> list[dict[str, str]]:
    """Rows of a CSV shipped in `kernels_cost_model/data/`."""
    text = resources.files("kernels_cost_model").joinpath("data", filename).read_text()
    return list(csv.DictReader(text.splitlines()))


def read_config_catalog(filename: str) -> list[dict]:
    """Entries of a JSON catalog in `kernels_cost_model/data/` (name, aliases, hf_id, source, config)."""
    text = resources.files("kernels_cost_model").joinpath("data", filename).read_text()
    return [dict(e, aliases="|".join(e.get("aliases", []))) for e in json.loads(text)["models"]]


def alias_index(rows: Iterable[dict[str, str]]) -> dict[str, str]:
    """Map every normalised name and alias to the canonical name."""
    index: dict[str, str] = {}
    for row in rows:
        canonical = row["name"]
        keys = [canonical, *(a for a in row.get("aliases", "").split("|") if a)]
        if row.get("hf_id"):
            keys.append(row["hf_id"])
        for key in keys:
            key = normalise(key)
            if index.setdefault(key, canonical) != canonical:
                raise ValueError(f"catalog alias {key!r} names both {index[key]!r} and {canonical!r}")
    return index


def lookup(entries: dict, index: dict[str, str], name: str, field: str, what: str):
    """The catalog entry `name` (or an alias) names, case-insensitively; ConfigError(field) if unknown."""
    canonical = index.get(normalise(str(name)))
    if canonical is None:
        raise ConfigError(field, name, f"unknown {what}; known: {', '.join(sorted(entries))}")
    return entries[canonical]
