"""Operators as (FLOPs, bytes moved), and the one roofline function that prices them.

time = max(flops * s_per_flop * (1 + tile_rows / rows), bytes * s_per_byte) + overhead_s, where
s_per_flop = 1 / (peak FLOP/s x compute efficiency), s_per_byte = 1 / (memory bandwidth x memory
efficiency), and `rows` is the operator's row count (tokens of a matmul, query rows of attention):
a kernel over few rows fills its tiles poorly, so its compute efficiency is rows / (rows + tile_rows)
of the large-batch one. Coefficients are fitted per operator family (calibration.py); peaks come from
hardware.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernels_cost_model.errors import require

from .prefill_waves import alike_path_keys, decode_path, fa2_sms, key_block, row_path_keys

#: Operator families: each has its own fitted coefficients.
FAMILIES = ("matmul", "elementwise", "prefill_attention", "decode_attention", "all_reduce")
#: Families a calibration may add: a fused MoE layer (without one the cost model prices grouped matmuls);
#: decode attention timed with its KV cache resident in L2 (`decode_attention_l2`: a benchmark state, as
#: AIConfigurator's tables replay one layer over one cache; fitted apart so that `decode_attention`, what
#: serving pays, is fitted on KV read from DRAM; serving never prices with it).
OPTIONAL_FAMILIES = ("moe", "decode_attention_l2", "prefill_attention_l2")
#: Families whose launches pay a cost per sequence (Coeffs.s_per_seq).
SEQUENCE_FAMILIES = ("prefill_attention", "decode_attention", "decode_attention_l2", "prefill_attention_l2")
#: Families whose launches pay a cost per key of their longest row (Coeffs.s_per_key).
KEY_FAMILIES = ("prefill_attention", "decode_attention", "decode_attention_l2", "prefill_attention_l2")
#: Families whose fits also price side terms (SIDE_FIELDS; shape_keys.side_terms): the side kernels of an
#: FA2 decode launch and the bytes that spill out of L2. The L2 benchmark states only: the families serving
#: prices with keep their form (serving prices unchanged).
SIDE_FAMILIES = ("decode_attention_l2", "prefill_attention_l2")
#: Families of causal prefill launches (a chunk of new tokens per sequence).
PREFILL_FAMILIES = ("prefill_attention", "prefill_attention_l2")

#: Profile operator name -> family.
OPERATOR_FAMILY = {
    "qkv_proj": "matmul", "o_proj": "matmul", "mlp_up": "matmul", "mlp_down": "matmul",
    "lm_head": "matmul", "moe_router": "matmul", "matmul": "matmul",
    "rms_norm": "elementwise", "add_rms_norm": "elementwise", "silu_mul": "elementwise", "rope": "elementwise", "add": "elementwise",
    "embedding": "elementwise",
    "prefill_attention": "prefill_attention", "decode_attention": "decode_attention",
    "decode_attention_l2": "decode_attention_l2", "prefill_attention_l2": "prefill_attention_l2",
    "all_reduce": "all_reduce", "moe": "moe",
}


@dataclass(frozen=True, slots=True)
class Coeffs:
    """One family's roofline coefficients: seconds per FLOP, per byte, per launch; tile rows; seconds
    per sequence of an attention launch (its work units: query loads, split-KV reductions); seconds per
    key of a causal launch's longest row (its critical path, operator_keys); side terms (SIDE_FAMILIES,
    shape_keys.side_terms): seconds per copy kernel, per combine kernel and per split it merges of an
    FA2 decode launch, and per byte spilled out of L2 in the L2 benchmark states; seconds per FLOP of the
    attention kernel inside a fit of a whole module (the MLA module: its score and value products run
    at another rate than its projection GEMMs, which take `s_per_flop`); seconds per row of a launch's
    serial row loop inside one chunk (a Gated DeltaNet prefill, modern_kernels.gdn_chunk_rows)."""

    s_per_flop: float
    s_per_byte: float
    overhead_s: float
    tile_rows: float = 0.0
    s_per_seq: float = 0.0
    s_per_key: float = 0.0
    s_per_copy: float = 0.0
    s_per_combine: float = 0.0
    s_per_split: float = 0.0
    s_per_spilled_byte: float = 0.0
    s_per_attention_flop: float = 0.0
    s_per_chunk_row: float = 0.0

    def __post_init__(self) -> None:
        for name in COEFF_FIELDS:
            value = getattr(self, name)
            require(value >= 0 and value == value, name, value, "must be a finite number >= 0")

    def time(self, flops: float, nbytes: float, rows: float = 1.0, seqs: float = 0.0, keys: float = 0.0,
             side: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0), attention_flops: float = 0.0,
             memory_floor: float = 0.0, chunk_rows: float = 0.0) -> float:
        """Seconds of one launch; `memory_floor`: seconds its memory side takes at least, priced elsewhere
        (a prefill's cached context read at the decode fit's rate, prefill_context_bytes); `chunk_rows`:
        rows of its serial in-chunk loop (s_per_chunk_row)."""
        copies, combines, splits, spilled = side
        return (roofline(flops, nbytes, rows, self, memory_floor) + seqs * self.s_per_seq + keys * self.s_per_key
                + copies * self.s_per_copy + combines * self.s_per_combine + splits * self.s_per_split
                + spilled * self.s_per_spilled_byte + attention_flops * self.s_per_attention_flop
                + chunk_rows * self.s_per_chunk_row)


#: Coeffs' side-term fields, in the order of shape_keys.side_terms' columns.
SIDE_FIELDS = ("s_per_copy", "s_per_combine", "s_per_split", "s_per_spilled_byte")
#: Coeffs' fields, in order.
COEFF_FIELDS = ("s_per_flop", "s_per_byte", "overhead_s", "tile_rows", "s_per_seq", "s_per_key", *SIDE_FIELDS,
                "s_per_attention_flop", "s_per_chunk_row")


def roofline(flops: float, nbytes: float, rows: float, c: Coeffs, memory_floor: float = 0.0) -> float:
    """Seconds for one operator: the slower of compute and memory (at least `memory_floor`), plus its
    fixed overhead."""
    memory = max(nbytes * c.s_per_byte, memory_floor)
    if flops <= 0.0:
        return memory + c.overhead_s
    compute = flops * c.s_per_flop * (1.0 + c.tile_rows / rows)
    return (compute if compute > memory else memory) + c.overhead_s


# ---- operators: (FLOPs, bytes) -------------------------------------------------------------

def matmul(m: float, n: float, k: float, dtype_bytes: int) -> tuple[float, float]:
    """[m x k] @ [k x n]: 2mnk FLOPs; reads A and B, writes C."""
    return 2.0 * m * n * k, float(dtype_bytes) * (m * k + k * n + m * n)


def elementwise(operator: str, m: float, n: float, dtype_bytes: int) -> tuple[float, float]:
    """Memory-bound ops over an [m x n] activation; their few FLOPs are never the bottleneck (0)."""
    elems = m * n
    if operator == "rms_norm":       # read x, write y, read the weight vector
        return 0.0, dtype_bytes * (2.0 * elems + n)
    if operator == "add_rms_norm":   # vLLM's fused residual add + RMSNorm: read x and the residual,
        return 0.0, dtype_bytes * (4.0 * elems + n)  # write y and the new residual, read the weight
    if operator == "silu_mul":       # read gate and up ([m x 2n]), write [m x n]
        return 0.0, dtype_bytes * 3.0 * elems
    if operator == "add":            # residual: read two, write one
        return 0.0, dtype_bytes * 3.0 * elems
    if operator == "rope":           # rotate q and k in place (n = their total width)
        return 0.0, dtype_bytes * 2.0 * elems
    if operator == "embedding":      # gather rows of the table, write them out
        return 0.0, dtype_bytes * 2.0 * elems
    raise ValueError(f"unknown elementwise operator {operator!r}")


def prefill_attention(chunk: float, context: float, batch: float, num_heads: float,
                      num_kv_heads: float, head_dim: float, dtype_bytes: int) -> tuple[float, float]:
    """Causal attention of `chunk` new tokens over `context` cached + themselves, `batch` requests.

    Query i of the chunk sees context + i + 1 keys: pairs = chunk*context + chunk*(chunk+1)/2;
    QK^T and PV cost 2 FLOPs per multiply-add each -> 4 * head_dim * heads per pair.
    Bytes: read Q, write O, read K and V of context + chunk tokens.
    """
    pairs = chunk * context + chunk * (chunk + 1) / 2.0
    flops = 4.0 * head_dim * num_heads * pairs * batch
    nbytes = dtype_bytes * batch * (2.0 * chunk * num_heads * head_dim
                                    + 2.0 * (context + chunk) * num_kv_heads * head_dim)
    return flops, nbytes


def decode_attention(context: float, batch: float, num_heads: float, num_kv_heads: float,
                     head_dim: float, dtype_bytes: int) -> tuple[float, float]:
    """One new token per request over context + 1 keys: reads the whole KV of each request."""
    return prefill_attention(1.0, context, batch, num_heads, num_kv_heads, head_dim, dtype_bytes)


def all_reduce(size_bytes: float, tp: float) -> tuple[float, float]:
    """Ring all-reduce: each GPU sends and receives 2(tp-1)/tp of the message (bus bytes)."""
    return 0.0, (2.0 * (tp - 1) / tp * size_bytes) if tp > 1 else 0.0


def experts_hit(tokens: float, experts: float, top_k: float) -> float:
    """Expected distinct experts that `tokens` tokens routed uniformly to `top_k` of `experts` touch."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def balanced_experts_hit(tokens: float, experts: float, top_k: float) -> float:
    """Distinct experts touched when routing spreads the `tokens` x `top_k` rows evenly over the experts
    (the "balanced" distribution of AIConfigurator's MoE tables)."""
    return min(experts, tokens * top_k)


def routed_experts(row: dict) -> float:
    """Distinct experts a MoE profile row's tokens touched, as its measurement routed them (its
    `routing`: "balanced", or blank for uniform random routing)."""
    hit = balanced_experts_hit if row.get("routing") == "balanced" else experts_hit
    return hit(row["m"], row["num_experts"], row["top_k"])


def moe(tokens: float, hidden: float, inter: float, experts: float, top_k: float,
        dtype_bytes: int, active: float | None = None) -> tuple[float, float]:
    """Fused MoE experts on one GPU: gate/up ([h x 2i]) and down ([i x h]) for each routed token.

    Bytes: the weights of every expert hit (`active`; default: uniform routing's expectation), the
    tokens in and out, the routed rows' intermediates.
    """
    rows = tokens * top_k
    flops = 2.0 * rows * 3.0 * hidden * inter
    if active is None:
        active = experts_hit(tokens, experts, top_k)
    weights = active * 3.0 * hidden * inter
    return flops, dtype_bytes * (weights + 2.0 * tokens * hidden + 3.0 * rows * inter)


def operator_rows(row: dict) -> float:
    """The row count that sets tile efficiency: matmul m, rows per expert of a MoE layer; for a prefill,
    its chunk (query rows per request) scaled so that only the chunk's own causal pairs pay the tile term
    (prefill_tile_rows)."""
    family = OPERATOR_FAMILY[row["operator"]]
    if family == "matmul":
        return max(row["m"], 1.0)
    if family in PREFILL_FAMILIES:
        return prefill_tile_rows(max(row["chunk"], 1.0), row["context"])
    if family == "moe":
        return max(row["m"] * row["top_k"] / routed_experts(row), 1.0)
    return 1.0  # decode attention: one query row per request (its tile factor is a constant)


def prefill_context_bytes(chunk: float, context: float, batch: float, num_kv_heads: float, head_dim: float,
                          dtype_bytes: int) -> float:
    """Bytes of the cached keys and values a prefill launch reads (0 over an empty cache).

    On the GPUs whose prefill fits saw no cached context (all but the FA2 ones, prefill_waves.py), the
    prefill family's byte rate was never binding (a prefill over an empty cache is compute-bound), so
    these bytes are read at least at the decode fit's rate of the same head layout, which measures the
    same cache read from DRAM (calibration.predict, cost_model._attention). A short chunk over a long
    context is then a decode-like read of its cache, as FlashAttention runs it."""
    return 2.0 * dtype_bytes * batch * context * num_kv_heads * head_dim if chunk > 1 else 0.0


def prefill_tile_rows(chunk: float, context: float) -> float:
    """The `rows` of a prefill's tile term: chunk x (all its pairs / its own causal pairs).

    The prefill fits see only launches over an empty cache (AIConfigurator's context rows), where the
    tile term prices a short chunk's every FLOP at a lower rate: with tile rows T it adds T / chunk of the
    FLOPs, T x (chunk + 1) / 2 pairs per head, one cost per query row whatever the keys. That is the work
    of the chunk's query tiles (their loads, softmax and output, the causal diagonal), which does not grow
    with the keys cached before the chunk. So only the chunk's own pairs pay it and the cached context's
    chunk x context pairs run at the family's FLOP rate, as the long key loops of a big prefill do:
    F x T / rows = own pairs' FLOPs x T / chunk. Over an empty cache this is the chunk (the fit unchanged).
    (Pricing the context pairs at the short chunk's rate made a 32-token chunk over 8,192 cached tokens
    on an H200 5.6x slower than FlashAttention-2 measured on that GPU, and FA3 is the faster kernel.)"""
    return chunk * (1.0 + 2.0 * context / (chunk + 1.0))


def operator_seqs(row: dict) -> float:
    """Work units that each pay Coeffs.s_per_seq: sequences of an attention launch; token rows of an
    elementwise launch (vLLM's norm and activation kernels run one thread block per token, so a narrow
    row costs more than its bytes); routed rows (token x expert) of a FusedMoE layer, which its
    alignment, activation and weighted-sum kernels handle one by one beside the grouped GEMMs
    (operators.FusedMoE); 0 for other families."""
    family = OPERATOR_FAMILY[row["operator"]]
    if family == "elementwise":
        return row["m"]
    if family == "moe":
        return row["m"] * row["top_k"]
    return row["batch"] if family in SEQUENCE_FAMILIES else 0.0


def single_token_prefill(row: dict) -> bool:
    """A prefill row of 1 new token per request: vLLM runs it as a decode (its FlashInfer backend sends
    query length 1 to the decode kernel; FlashAttention's varlen path with max_seqlen_q == 1 packs the
    query heads of a KV head as rows, as for decodes), and so does the cost model (batch_fold.py): such
    rows are priced with the decode coefficients and do not enter the prefill fit."""
    return row["operator"] == "prefill_attention" and row["chunk"] == 1


def operator_keys(row: dict) -> float:
    """Keys the longest row of an attention launch reads (prefill: context + chunk; decode: context + 1):
    the kernel splits the work into (query tile, head, sequence) units that run in parallel, and the unit
    holding a row's last query rows loops over all its keys (a decode's, over as many as its KV split
    leaves it), so a launch with too few units to fill the GPU cannot finish before that one does. On
    GPUs whose prefill kernel is FA2's, a launch's path is its waves of units over the SMs (prefill_waves.py:
    a prefill's 64-row units; a decode's split-KV units, split as FA2's heuristic splits the profiled
    launch). Its cost per key (Coeffs.s_per_key) adds to the roofline; 0 for other families."""
    family = OPERATOR_FAMILY[row["operator"]]
    if family not in KEY_FAMILIES:
        return 0.0
    if family == "prefill_attention_l2" and row["chunk"] > 1 and fa2_sms(str(row.get("device", ""))):
        return alike_path_keys(str(row["device"]), row["chunk"], row["context"], row["batch"], row["num_heads"],
                               row["head_dim"])  # a benchmark launch of alike sequences: whole waves
    if family in PREFILL_FAMILIES and row["chunk"] > 1:  # FA2 GPUs: waves of units (prefill_waves.py)
        return row_path_keys(str(row.get("device", "")), row["chunk"], row["context"], row["batch"],
                             row["num_heads"], row["head_dim"])
    sms = fa2_sms(str(row.get("device", "")))
    if sms:  # a decode (or one-token prefill) on an FA2 GPU: its split-KV units' waves
        return decode_path(row["batch"], row["context"] + 1.0, row["num_heads"], row["num_kv_heads"], sms,
                           key_block(row["head_dim"]))
    return row["context"] + (row["chunk"] if family in PREFILL_FAMILIES else 1.0)


def operator_cost(row: dict) -> tuple[float, float]:
    """(FLOPs, bytes) of one profile row (see profile_schema.py for the columns)."""
    op, d = row["operator"], int(row["dtype_bytes"])
    family = OPERATOR_FAMILY[op]
    if family == "matmul":
        return matmul(row["m"], row["n"], row["k"], d)
    if family == "elementwise":
        return elementwise(op, row["m"], row["n"], d)
    if family in PREFILL_FAMILIES:
        return prefill_attention(row["chunk"], row["context"], row["batch"], row["num_heads"],
                                 row["num_kv_heads"], row["head_dim"], d)
    if family in ("decode_attention", "decode_attention_l2"):
        return decode_attention(row["context"], row["batch"], row["num_heads"], row["num_kv_heads"],
                                row["head_dim"], d)
    if family == "moe":
        return moe(row["m"], row["n"], row["k"], row["num_experts"], row["top_k"], d, routed_experts(row))
    return all_reduce(row["size_bytes"], row["tp"])
