"""Fold a batch's rows into the few aggregates the cost model prices (decode count, prefill sums).

Decode rows (1 new token) are counted by C-level list scans; the few prefill rows (> 1 new token) are
found by scans too while they stay few, else by one plain pass.
"""
from __future__ import annotations

from operator import add, mul


#: Use the scan path while prefill rows and their distinct sizes stay this few.
_SCAN_MAX_ROWS, _SCAN_MAX_SIZES = 32, 8


def _indices_of(values: list[int], wanted) -> list[int]:
    """Indices of the entries equal to any of `wanted` (few), by list.count/index scans in C."""
    found: list[int] = []
    for v in wanted:
        i = -1
        for _ in range(values.count(v)):
            i = values.index(v, i + 1)
            found.append(i)
    return found


def _chunk_values(values: list[int], n_zero: int, n_one: int) -> list[int]:
    """Distinct entries > 1 (prefill chunk sizes): past the zeros and ones of the sorted list."""
    distinct: list[int] = []
    for v in sorted(values)[n_zero + n_one:]:
        if not distinct or v != distinct[-1]:
            distinct.append(v)
    return distinct


def _fold_prefill_rows(new: list[int], ctx: list[int], n_dec: int) -> tuple:
    """(tokens, context, query-key pairs, tile weight, rows) of the prefill rows (> 1 new token),
    the context of rows with 0 new tokens (they read nothing), the keys of the longest prefill row
    (context + chunk: the causal launch's critical path, roofline.operator_keys), and the prefill rows'
    (new tokens, context) lists (None when every row is a prefill chunk: `new` and `ctx` themselves)."""
    n = len(new)
    n_zero = new.count(0)
    if n_dec == 0 and n_zero == 0:  # all rows are prefill chunks: C-level reductions
        tok, cp, cc, pctx = sum(new), sum(map(mul, new, ctx)), sum(map(mul, new, new)), sum(ctx)
        return tok, pctx, cp + 0.5 * (cc + tok), 0.5 * (tok + n), n, 0, max(map(add, new, ctx)), None
    chunks = _chunk_values(new, n_zero, n_dec) if n - n_dec <= _SCAN_MAX_ROWS else None
    rows = _indices_of(new, chunks) if chunks is not None and len(chunks) <= _SCAN_MAX_SIZES else None
    pf_tok = pf_ctx = idle_ctx = n_pf = longest = 0
    pf_pairs = pf_tile = 0.0
    pf_new: list[int] = []
    pf_ctxs: list[int] = []
    if rows is not None:  # a few prefill rows, found by C-level scans
        pairs = ((new[i], ctx[i]) for i in rows)
        if n_zero:
            idle_ctx = sum(ctx[i] for i in _indices_of(new, (0,)))
    else:                 # many prefill rows: one plain pass
        pairs = zip(new, ctx)
    for c, p in pairs:
        if c > 1:
            pf_tok += c
            pf_ctx += p
            pf_pairs += c * p + 0.5 * c * (c + 1)
            pf_tile += 0.5 * (c + 1)  # = own causal pairs / chunk: the tile term's weight (prefill_tile_rows)
            n_pf += 1
            pf_new.append(c)
            pf_ctxs.append(p)
            if c + p > longest:
                longest = c + p
        elif c == 0 and rows is None:
            idle_ctx += p
    return pf_tok, pf_ctx, pf_pairs, pf_tile, n_pf, idle_ctx, longest, (pf_new, pf_ctxs)
