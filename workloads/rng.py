"""Seeded generators: one seed, one independent stream per named component. No global RNG."""
from __future__ import annotations

import hashlib

import numpy as np

from kernels_cost_model.errors import require
from sim.core.fields import is_int


def _name_words(name: str) -> list[int]:
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return [int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4)]


def make_rng(seed: int, name: str = "") -> np.random.Generator:
    """A generator for component `name` under `seed`; different names give independent streams."""
    require(is_int(seed) and seed >= 0, "seed", seed, "must be an integer >= 0")
    require(isinstance(name, str), "name", name, "must be a string")
    return np.random.default_rng(np.random.SeedSequence([int(seed), *_name_words(name)]))

