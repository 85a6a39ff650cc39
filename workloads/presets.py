"""Named (prompt, output) length presets fitted to public data, shipped as parameters.

The numbers live in workloads/data/length_presets.json, written by benchmarks/fit_length_presets.py
together with each preset's source file, licence and fit quality (KS statistic, quantile errors), so
the defaults work on a machine without the data. Two shapes per preset: "quantile" (default; a
quantile table per column, KS < 0.01) and "lognormal" (clipped lognormals; KS 0.07-0.22).
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from kernels_cost_model.errors import require
from workloads.lengths import SINGLE_COLUMN, Copula, LogNormal, Quantile

PRESET_FILE = Path(__file__).resolve().parent / "data" / "length_presets.json"
ALIASES = {"chat": "sharegpt", "arxiv": "arxiv_summarization", "summarization": "arxiv_summarization",
           "bwb": "bwb_translation", "translation": "bwb_translation", "code": "azure_code",
           "conversation": "azure_conv", "mooncake": "mooncake_conversation"}
SHAPES = ("quantile", "lognormal")


@cache
def _presets() -> dict:
    return json.loads(PRESET_FILE.read_text())["presets"]


def preset_names() -> list[str]:
    """Canonical preset names (aliases: see ALIASES)."""
    return sorted(_presets())


def preset_info(name: str) -> dict:
    """The stored entry of a preset: source, file, rows, parameters and fit quality per shape."""
    key = ALIASES.get(name, name)
    require(key in _presets(), "lengths", name,
            f"unknown preset; choose one of {preset_names()} or aliases {sorted(ALIASES)}")
    return _presets()[key]


def length_preset(name: str, shape: str = "quantile") -> Copula:
    """The (prompt, output) sampler of preset `name`, e.g. length_preset("sharegpt")."""
    require(shape in SHAPES, "shape", shape, f"must be one of {SHAPES}")
    entry = preset_info(name)[shape]
    if shape == "lognormal":
        marginal = lambda col: LogNormal(col["mu"], col["sigma"], col["low"], col["high"])
        return Copula(marginal(entry["prompt"]), marginal(entry["output"]), entry["rho"])
    return Copula(Quantile(entry["probs"], entry["prompt"]), Quantile(entry["probs"], entry["output"]),
                  entry["rho"])


def resolve_lengths(lengths):
    """A pair sampler from a preset name ("sharegpt", "sharegpt:lognormal") or a sampler as is."""
    if isinstance(lengths, str):
        name, _, shape = lengths.partition(":")
        require(shape in ("", *SHAPES), "lengths", lengths, f"the part after ':' is a shape, one of {SHAPES}")
        return length_preset(name, shape or "quantile")
    require(hasattr(lengths, "sample"), "lengths", lengths,
            "must be a preset name or a (prompt, output) sampler with .sample(rng, n)")
    require(not isinstance(lengths, SINGLE_COLUMN), "lengths", lengths,
            "is one length distribution; pair a prompt and an output one, e.g. Independent(prompt, output)")
    return lengths
