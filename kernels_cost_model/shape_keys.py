"""Coefficients per kernel shape: which fitted coefficients price a matmul, an attention launch, a MoE layer.

One efficiency per family does not fit every kernel: a GEMM's efficiency depends on its weight's
(n, k) (tiles, split-K, wave counts), an attention kernel's on its head layout (query heads, KV heads,
head size: how FlashAttention packs query heads that share a KV head). Calibrations fitted on a grid of
shapes therefore also hold coefficients per shape, keyed `family@shape`:

- `matmul@<n>x<k>` (output features x input features),
- `prefill_attention@<heads>/<kv_heads>/<head_dim>`, `decode_attention@...` (heads on one GPU),
- `moe@<hidden>/<inter>/<experts>/<top_k>` (per GPU),
- `elementwise.<op>@l2`, `elementwise.<op>@dram`: an elementwise operator by where its data sits
  (l2_cache.py), on GPUs with a documented L2 size.

Lookup: the exact shape; else, for matmuls, bilinear interpolation in (log n, log k) between the four
grid shapes around it (a GEMM table's grid; a model layer's own shape, measured in per-layer profiles, is
only used exactly); for attention, the nearest fitted layout with the same head size (distance in
log query-heads-per-KV-head, then log heads); else the caller falls back to the family's coefficients.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from functools import lru_cache

from .l2_cache import dram_bytes, elementwise_tier, l2_bytes, wave_bytes
from .prefill_waves import decode_copies, decode_splits, fa2_sms, key_block
from .roofline import (COEFF_FIELDS, OPERATOR_FAMILY, PREFILL_FAMILIES, Coeffs, operator_cost,
                       single_token_prefill)

#: Families priced per head layout.
ATTENTION_FAMILIES = ("prefill_attention", "decode_attention", "decode_attention_l2", "prefill_attention_l2")
_FIELDS = COEFF_FIELDS


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def matmul_key(n: float, k: float) -> str:
    return f"matmul@{_num(n)}x{_num(k)}"


def attention_key(family: str, heads: float, kv_heads: float, head_dim: float) -> str:
    return f"{family}@{_num(heads)}/{_num(kv_heads)}/{_num(head_dim)}"


def moe_key(hidden: float, inter: float, experts: float, top_k: float) -> str:
    return f"moe@{_num(hidden)}/{_num(inter)}/{_num(experts)}/{_num(top_k)}"


def elementwise_key(row: dict) -> str | None:
    """`elementwise.<op>@<tier>` of an elementwise row on a GPU with a known L2 size, else None."""
    tier = elementwise_tier(str(row.get("device", "")), operator_cost(row)[1])
    return None if tier is None else f"elementwise.{row['operator']}@{tier}"


def kernel_cost(row: dict) -> tuple[float, float]:
    """(FLOPs, bytes) of a profile row as its coefficients price it: an elementwise row's latency side
    is its waves of token rows and, in the DRAM tier, only the bytes past the L2 limit count
    (l2_cache.py); a prefill on an FA2 GPU has no FLOP side (its path keys are; prefill_waves.py);
    every other row is roofline.operator_cost."""
    flops, nbytes = operator_cost(row)
    family = OPERATOR_FAMILY[row["operator"]]
    if family in PREFILL_FAMILIES and row["chunk"] > 1 and fa2_sms(str(row.get("device", ""))):
        return 0.0, nbytes  # FA2: the waves of units are the compute (prefill_waves.py, operator_keys)
    if family != "elementwise":
        return flops, nbytes
    device = str(row.get("device", ""))
    if elementwise_tier(device, nbytes) == "dram":
        nbytes = dram_bytes(device, nbytes)
    return wave_bytes(device, row["m"], row["n"] * row["dtype_bytes"], row["operator"]), nbytes


#: side_terms of a row with none (every row outside the L2 states' mechanisms).
NO_SIDE = (0.0, 0.0, 0.0, 0.0)


def side_terms(row: dict) -> tuple[float, float, float, float]:
    """(copy kernels, combine kernels, splits combined, bytes spilled) of a profile row, the columns of
    roofline.SIDE_FIELDS (fitted for roofline.SIDE_FAMILIES only; zero for every other row):

    - a decode (or a one-token prefill, which runs as one) on an FA2 GPU: the swapped layout's query and
      output copies (prefill_waves.decode_copies) and, where FA2's heuristic splits the profiled launch's
      keys, the combine kernel that merges the splits' partial results in a loop over them;
    - a prefill in the L2 benchmark state: its bytes past the share of the L2 that stays resident
      (l2_cache.dram_bytes), read from DRAM again on every replay as the working set nears the L2 size.
    """
    family = OPERATOR_FAMILY[row["operator"]]
    device = str(row.get("device", ""))
    if family == "prefill_attention_l2" and row["chunk"] > 1:
        return (0.0, 0.0, 0.0, dram_bytes(device, operator_cost(row)[1]) if l2_bytes(device) else 0.0)
    decode = family in ("decode_attention", "decode_attention_l2") or single_token_prefill(row)
    sms = fa2_sms(device) if decode else 0
    if not sms:
        return NO_SIDE
    splits = decode_splits(row["batch"], row["context"] + 1.0, row["num_heads"], row["num_kv_heads"], sms,
                           key_block(row["head_dim"]))
    combined = splits > 1
    return (float(decode_copies(row["batch"], row["num_heads"], row["num_kv_heads"])), float(combined),
            float(splits) if combined else 0.0, 0.0)


def shape_key(row: dict) -> str | None:
    """The shape key of a profile row, or None for families priced per operator only."""
    family = OPERATOR_FAMILY[row["operator"]]
    if family == "elementwise":
        return elementwise_key(row)
    if family == "matmul":  # a GEMM table's shape, or a model layer's own (per-layer profiles)
        return matmul_key(row["n"], row["k"])
    if family in ATTENTION_FAMILIES:
        return attention_key(family, row["num_heads"], row["num_kv_heads"], row["head_dim"])
    if family == "moe":
        return moe_key(row["n"], row["k"], row["num_experts"], row["top_k"])
    return None


@lru_cache(maxsize=None)
def _parse(key: str) -> tuple[float, ...]:
    """The shape of a key: "matmul@4096x1024" -> (4096.0, 1024.0)."""
    return tuple(float(p) for p in key.split("@", 1)[1].replace("x", "/").split("/"))


def _shapes(coeffs: dict, family: str) -> dict[tuple[float, ...], Coeffs]:
    prefix = family + "@"
    return {_parse(key): c for key, c in coeffs.items() if key.startswith(prefix)}


def _blend(corners: list[tuple[float, Coeffs]]) -> Coeffs:
    return Coeffs(*(sum(w * getattr(c, f) for w, c in corners) for f in _FIELDS))


def matmul_coeffs(coeffs: dict, n: float, k: float) -> Coeffs | None:
    """Coefficients of an [. x k] @ [k x n] GEMM: exact grid shape, else bilinear in log n, log k."""
    exact = coeffs.get(matmul_key(n, k))
    if exact is not None:
        return exact
    grid = _shapes(coeffs, "matmul")
    ns, ks = _grid_lines(grid)
    if not ns:
        return None
    (n0, n1, wn), (k0, k1, wk) = _bracket(ns, n), _bracket(ks, k)
    corners = [((1 - wn) * (1 - wk), (n0, k0)), (wn * (1 - wk), (n1, k0)), ((1 - wn) * wk, (n0, k1)),
               (wn * wk, (n1, k1))]
    if any(w > 0 and s not in grid for w, s in corners):
        return None
    return _blend([(w, grid[s]) for w, s in corners if w > 0])


#: Share of the (n, k) pairs of the grid lines that must be measured for the shapes to form a grid.
GRID_FILL = 0.9


def _grid_lines(grid: dict) -> tuple[list[float], list[float]]:
    """The n and k values of the calibration's interpolation grid ([], [] if its shapes form none).

    A GEMM table's shapes form a (nearly) full rectangle; a model layer's own shape from per-layer
    profiles (14336 x 4096) is priced exactly but is no grid line: values that occur in no more than half
    as many shapes as the most common one are left out, and what is left must span two values of each
    and be at least GRID_FILL full.
    """
    if not grid:
        return [], []
    count_n, count_k = Counter(s[0] for s in grid), Counter(s[1] for s in grid)
    ns = sorted(v for v, c in count_n.items() if 2 * c > max(count_n.values()))
    ks = sorted(v for v, c in count_k.items() if 2 * c > max(count_k.values()))
    filled = sum((n, k) in grid for n in ns for k in ks)
    is_grid = len(ns) >= 2 and len(ks) >= 2 and filled >= GRID_FILL * len(ns) * len(ks)
    return (ns, ks) if is_grid else ([], [])


def on_matmul_grid(coeffs: dict, key: str) -> bool:
    """Whether a `matmul@n x k` key is a point of its calibration's interpolation grid."""
    n, k = _parse(key)
    ns, ks = _grid_lines(_shapes(coeffs, "matmul"))
    return n in ns and k in ks


def _bracket(values: list[float], x: float) -> tuple[float, float, float]:
    """(lower, upper, weight of upper) of x among sorted values in log space, clamped at the ends."""
    if x <= values[0]:
        return values[0], values[0], 0.0
    if x >= values[-1]:
        return values[-1], values[-1], 0.0
    i = bisect_right(values, x)
    lo, hi = values[i - 1], values[i]
    return lo, hi, (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))


def attention_coeffs(coeffs: dict, family: str, heads: float, kv_heads: float, head_dim: float) -> Coeffs | None:
    """Coefficients of an attention launch with this head layout (see module docstring)."""
    exact = coeffs.get(attention_key(family, heads, kv_heads, head_dim))
    if exact is not None:
        return exact
    same_dim = [(s, c) for s, c in _shapes(coeffs, family).items() if s[2] == head_dim]
    if not same_dim:
        return None
    group = math.log(heads / kv_heads)

    def distance(item):
        (h, kv, _), _c = item
        return (abs(math.log(h / kv) - group), abs(math.log(h / heads)), h, kv)

    return min(same_dim, key=distance)[1]


def moe_coeffs(coeffs: dict, hidden: float, inter: float, experts: float, top_k: float) -> Coeffs | None:
    """Coefficients of a MoE layer: its exact shape, else the fitted shape nearest in log sizes."""
    exact = coeffs.get(moe_key(hidden, inter, experts, top_k))
    if exact is not None:
        return exact
    shapes = _shapes(coeffs, "moe")
    if not shapes:
        return None
    target = (hidden, inter, experts, top_k)
    return min(shapes.items(), key=lambda item: (sum(abs(math.log(a / b)) for a, b in zip(item[0], target)),
                                                 item[0]))[1]


def coeffs_for_row(coeffs: dict, row: dict) -> Coeffs:
    """The coefficients that price a profile row: shape, then operator, then family."""
    family, op = OPERATOR_FAMILY[row["operator"]], row["operator"]
    if single_token_prefill(row):  # a decode as vLLM runs it: 1 key per request, from L2 where split
        family = "decode_attention_l2" if "decode_attention_l2" in coeffs else "decode_attention"
    found = None
    if family == "matmul":
        found = matmul_coeffs(coeffs, row["n"], row["k"])
    elif family in ATTENTION_FAMILIES:
        found = attention_coeffs(coeffs, family, row["num_heads"], row["num_kv_heads"], row["head_dim"])
    elif family == "moe":
        found = moe_coeffs(coeffs, row["n"], row["k"], row["num_experts"], row["top_k"])
    elif family == "elementwise":
        key = elementwise_key(row)
        found = coeffs.get(key) if key else None
    return found or coeffs.get(f"{family}.{op}") or coeffs[family]
