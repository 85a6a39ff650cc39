"""argparse types shared by the commands: token counts as vLLM's CLI writes them."""
from __future__ import annotations

import argparse
import re

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30}


def human_int(text: str) -> int:
    """An integer, or one with vLLM's suffixes: k/m/g decimal ("25.6k" -> 25600), K/M/G binary
    ("32K" -> 32768, whole numbers only), as vLLM's `--max-model-len` and `--max-num-batched-tokens`
    take them."""
    value = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgKMG])", value)
    if match is None:
        try:
            return int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: not an integer (suffixes: 8k = 8000, 8K = 8192)") from None
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(f"{text!r}: a binary suffix takes a whole number ({number}{suffix.lower()}?)")
    return int(number) * _BINARY[suffix]


def human_int_or_auto(text: str) -> int:
    """`human_int`, or "auto" / -1: -1 (vLLM's `--max-model-len auto`, fit to the KV cache)."""
    if text.strip().lower() in ("auto", "-1"):
        return -1
    return human_int(text)
