"""Deterministic token ids for prompts and scripted answers (no tokenizer, no model).

Prompt ids come from a seeded generator or from a counter-based hash (splitmix64), so equal keys
(a Mooncake hash id, a shared-prefix id) always give equal token blocks, in any process.
"""
from __future__ import annotations

from functools import cache

import numpy as np

from workloads.token_streams import FILLER_BASE_TOKEN_ID, FILLER_SPAN

DEFAULT_EOS_TOKEN_ID = 2          # Llama-2's </s>
TOKEN_LOW, TOKEN_SPAN = 256, 1 << 15  # prompt ids avoid the low special-token range
TOKEN_HIGH = TOKEN_LOW + TOKEN_SPAN     # power-of-two span: cheap unbiased draws
MOONCAKE_BLOCK_SIZE = 512

_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def hashed_tokens(keys: np.ndarray, salt: int = 0) -> np.ndarray:
    """int32 ids in [TOKEN_LOW, TOKEN_HIGH), one per uint64 key; same key, same id."""
    with np.errstate(over="ignore"):
        mixed = _splitmix64(np.asarray(keys, dtype=np.uint64) ^ np.uint64(salt * 0x2545F4914F6CDD1D % 2**64))
    return (TOKEN_LOW + mixed % np.uint64(TOKEN_HIGH - TOKEN_LOW)).astype(np.int32)


@cache
def _multipliers(block_size: int) -> np.ndarray:
    odd = np.random.default_rng(0x5EED).integers(0, 2**63, size=block_size, dtype=np.uint64)
    return (odd << np.uint64(1)) | np.uint64(1)


def block_tokens(hash_ids, length: int, block_size: int = MOONCAKE_BLOCK_SIZE, salt: int = 0) -> np.ndarray:
    """Prompt ids from prefix-block hash ids: block h is a fixed run of `block_size` ids
    (position j: top 15 bits of splitmix64(h) * a fixed odd multiplier_j); truncated to `length`."""
    h = np.asarray(hash_ids, dtype=np.uint64)
    with np.errstate(over="ignore"):
        keys = _splitmix64(h ^ np.uint64(salt))
        mixed = keys[:, None] * _multipliers(block_size)[None, :]
    ids = (mixed.ravel()[:length] >> np.uint64(64 - 15)).astype(np.int32)
    ids += TOKEN_LOW
    return ids


def random_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` uniformly random prompt ids from `rng`."""
    raw = rng.bit_generator.random_raw((n + 3) // 4).view(np.uint16)[:n]  # 4 ids per 64 raw bits
    ids = np.empty(n, dtype=np.int32)
    np.bitwise_and(raw, np.uint16(TOKEN_SPAN - 1), out=ids)  # (masked into int32 at once: ~5x faster
    ids += TOKEN_LOW                                         # than a uint16 mask, then a cast)
    return ids


def random_prompts(rng: np.random.Generator, lengths: np.ndarray) -> list[np.ndarray]:
    """One random prompt per length, drawn in one vectorised call (views into one array: the slices
    `np.split` gives, without its per-piece `swapaxes` call)."""
    flat = random_tokens(rng, int(lengths.sum()))
    ends = np.cumsum(lengths).tolist()
    return [flat[start:end] for start, end in zip([0] + ends[:-1], ends)]


def answer_tokens(index: int, n: int, eos_token_id: int = DEFAULT_EOS_TOKEN_ID) -> tuple[int, ...]:
    """A scripted answer of `n` tokens: filler ids (as token_streams.filler_token) ending in EOS."""
    pos = np.arange(n - 1, dtype=np.int64)
    filler = FILLER_BASE_TOKEN_ID + (index * 7919 + pos * 104729) % FILLER_SPAN
    return tuple(filler.tolist()) + (int(eos_token_id),)
