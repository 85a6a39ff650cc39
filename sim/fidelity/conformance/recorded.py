"""Recorded vLLM traces: a gzipped JSON-lines file per vLLM version.

Line 1 is a header `{"vllm_version": "0.33.0", "step_s": 1.0}`; every other line is one case
`{"scenario": {...}, "trace": {...}}`, with an optional `"name"` for hand-made regression scenarios.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from sim.core.scheduler_profiles import PROFILES, profile_for_version as scheduler_profile_for


def read_recorded(path: str | Path) -> tuple[str, list[dict]]:
    """(vLLM version, cases) of a recorded file."""
    with gzip.open(path, "rt") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return lines[0]["vllm_version"], lines[1:]


def profile_for_version(version: str) -> str:
    """The scheduler profile modelling vLLM `version` (matched on major.minor)."""
    name = scheduler_profile_for(version)
    if name is not None:
        return name
    raise ValueError(f"no scheduler profile models vLLM {version}; have {sorted(PROFILES)}")
