"""Durations of consecutive pure-decode steps of one batch under the roofline model, as one array.

In a pure-decode batch of n rows every operator but attention sees the same n tokens and n sampled rows
step after step; only the keys attention reads grow (by n a step, the longest context by 1). So the
constant terms are priced once by `RooflineCostModel._price` itself (and kept per batch size) and the
attention term step by step, with the same floating-point operations in the same order as `step_time`
(IEEE float64 in numpy and in Python alike): bit-identical durations.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .attention_backend import imbalance_alpha
from .prefill_waves import decode_launch_units

VECTOR_FROM = 48   # steps from which the stretch is priced in numpy rather than in a Python loop
EXACT_BELOW = 1 << 51  # integer figures below this: `_step_times` takes its ceilings in integers (`_integral`)


def sequential_sum_of_floats() -> bool:
    """Whether the built-in `sum` adds floats one after the other (Python < 3.12 does; later versions
    compensate rounding, which this module does not reproduce)."""
    return sum([1e100, 1.0, -1e100]) == 0.0


SEQUENTIAL_SUM = sequential_sum_of_floats()


@dataclass(frozen=True, slots=True)
class _Fixed:
    """What a pure-decode step of n rows prices the same whatever the contexts."""

    head: float       # 0 + qkv + o + mlp + routing terms, summed in step_time's order
    tail: tuple       # the norms, LM-head and all-reduce terms, added after attention's two
    cpu: float        # the CPU term before the async overlap
    alpha: float | None  # measured decode imbalance at n rows (None: priced at the mean context)
    c_pf: float
    m_pf: float
    hx_tile_flop: tuple  # (4 x heads x head_dim, 1 + tile_rows, s_per_flop) of the decode coefficients
    q_term: float     # 2.0 * n * q_gpu
    kv_gpu: float
    d: float
    s_per_byte: float
    overhead: float
    pf_path: float    # 0 x the prefill key cost (no chunk); the launch's path is the longer of it and decode's
    s_per_key: float  # decode's cost per key of the longest row (the launch's critical path)
    layers: float
    async_: bool
    waves: tuple | None = None  # FA2: (rows, *RooflineCostModel.decode_launch) of prefill_waves.decode_path
    units: dict = field(default_factory=dict)  # FA2: key blocks of the longest row -> _units (memo)


_FIXED: dict = {}  # (id(model), n) -> (model, _Fixed); the model kept so its id is not reused
_FIXED_MAX = 4096  # entries kept (a calibration fit builds many models): cleared beyond


def _fixed_for(model, n: int) -> _Fixed:
    entry = _FIXED.get((id(model), n))
    if entry is None or entry[0] is not model:
        if len(_FIXED) >= _FIXED_MAX:
            _FIXED.clear()
        entry = _FIXED[(id(model), n)] = (model, _fixed(model, n))
    return entry[1]


def decode_step_time(model, num_rows: int, context_sum: int, longest: int) -> float:
    """`RooflineCostModel.step_time` of one pure-decode step (every row 1 new token and sampling)
    over contexts summing to `context_sum`, the longest `longest`.
    Only where SEQUENTIAL_SUM holds and num_rows >= 1."""
    fixed, dec_keys, longest = _fixed_for(model, num_rows), context_sum + num_rows, longest + 1
    if _integral(dec_keys, longest):
        return _step_times(fixed, num_rows, dec_keys, longest, 1)[0]
    return float(_steps(fixed, num_rows, np.array([dec_keys]), np.array([longest]))[0])


def roofline_decode_times(model, num_rows: int, context_sum: int, longest: int, first: int,
                          count: int) -> list[float] | None:
    """`model.step_time` of decode steps first .. first+count-1 of a stretch whose step 0 has `num_rows`
    rows of 1 new token over contexts summing to `context_sum` (longest `longest`); step u's contexts
    sum to context_sum + num_rows * u. None where the exact closed form does not apply. `model`: a
    RooflineCostModel itself (not a subclass, which may price otherwise)."""
    if not SEQUENTIAL_SUM or num_rows < 1 or count < 1:
        return None
    n = num_rows
    fixed = _fixed_for(model, n)
    if count < VECTOR_FROM and _integral(context_sum + n * (first + count), longest + first + count):
        return _step_times(fixed, n, context_sum + n * first + n, longest + first + 1, count)
    steps = np.arange(first, first + count, dtype=np.int64)
    return _steps(fixed, n, (context_sum + n * steps) + n, longest + steps + 1).tolist()


def _integral(dec_keys, longest) -> bool:
    """Whether `_step_times` may take the ceilings of its quotients in integers (its last step's
    figures): Python ints below `EXACT_BELOW`. For such an a >= 0 and ints b, c >= 1 the float
    quotient a / b / c (or a / b) lies within a * 2**-51 / (b * c) < 1 / (b * c) of the exact one,
    which is an integer (then both are exact) or lies at least 1 / (b * c) from one: its ceiling is
    the exact quotient's, -(-a // (b * c))."""
    return type(dec_keys) is int and type(longest) is int and dec_keys < EXACT_BELOW and longest < EXACT_BELOW


def _fixed(model, n: int) -> _Fixed:
    const = model._price(model._padded(n), n, n, n, 0, 0, 0, 0, 0, (0, 0))  # all but attention: fixed
    head = 0
    for term in const[:4]:
        head = head + term
    pf, dc, d = model.prefill, model.decode, model.dtype_bytes
    hx = 4.0 * model.heads_gpu_x_hd
    alpha = None
    if model.decode_imbalance is not None and n > 1:
        alpha = imbalance_alpha(model.decode_imbalance[0], n)
    cpu = model._cpu_s(n, n)
    return _Fixed(head=head, tail=(const[6], const[7], const[8]), cpu=cpu, alpha=alpha,
                  c_pf=hx * (0 + pf.tile_rows * 0) * pf.s_per_flop,
                  m_pf=d * (2.0 * 0 * model.q_gpu + 2.0 * (0 + 0) * model.kv_gpu) * pf.s_per_byte,
                  hx_tile_flop=(hx, 1.0 + dc.tile_rows, dc.s_per_flop), q_term=2.0 * n * model.q_gpu,
                  kv_gpu=model.kv_gpu, d=d, s_per_byte=dc.s_per_byte,
                  overhead=dc.overhead_s + 0 * pf.s_per_seq + n * dc.s_per_seq, pf_path=0 * pf.s_per_key,
                  s_per_key=dc.s_per_key, layers=model.layers,
                  async_=model.async_scheduling,
                  waves=(n, *model.decode_launch(n)) if model.decode_waves[0] else None)


def _units(waves: tuple, blocks: int) -> tuple[int, int, int]:
    """(waves, key blocks a unit walks, splits) of an FA2 pure-decode step whose longest row holds
    `blocks` (prefill_waves.decode_path)."""
    n, heads, kv, sms, block, decided_at = waves
    return decode_launch_units(n, blocks, heads, kv, sms, decided_at)


def _step_times(f: _Fixed, n: int, dec_keys: int, longest: int, count: int) -> list[float]:
    """The prices (Python floats) of `count` consecutive steps, as `RooflineCostModel.step_time`
    computes each: the first over `dec_keys` keys with the longest row at `longest`, each next one
    over n keys more and a longest row 1 longer. One loop with the step's figures held in locals;
    FA2's key blocks are counted in integers, the same counts as the float ceilings (`_integral`)."""
    alpha, (hx, tile, s_per_flop) = f.alpha, f.hx_tile_flop
    d, q_term, kv_gpu, s_per_byte = f.d, f.q_term, f.kv_gpu, f.s_per_byte
    c_pf, m_pf, overhead, pf_path, s_per_key = f.c_pf, f.m_pf, f.overhead, f.pf_path, f.s_per_key
    head, layers, (tail0, tail1, tail2), cpu0, async_ = f.head, f.layers, f.tail, f.cpu, f.async_
    waves, memo = f.waves, f.units
    if waves is not None:
        rows, block = waves[0], waves[4]
        rows_block, float_block = rows * block, float(block)
    times = []
    for _ in range(count):
        keys = dec_keys if alpha is None else dec_keys + alpha * (n * longest - dec_keys)
        c_dec = hx * keys * tile * s_per_flop
        m_dec = d * (q_term + 2.0 * keys * kv_gpu) * s_per_byte
        compute, memory = c_pf + c_dec, m_pf + m_dec
        if waves is None:
            critical = longest
        else:  # prefill_waves.decode_path of an FA2 pure-decode step (the same key blocks, in integers)
            blocks = -(-longest // block)
            if blocks < 1:
                blocks = 1
            units = memo.get(blocks)
            if units is None:
                units = memo[blocks] = _units(waves, blocks)
            if units[0] == 1:
                critical = float(units[1] * block)
            else:
                mean = -(-dec_keys // rows_block)
                if mean < 1:
                    mean = 1
                mean = -(-mean // units[2])  # (mean_unit_blocks)
                critical = ((units[0] - 1) * mean + units[1]) * float_block
        path = critical * s_per_key
        total = (compute if compute > memory else memory) + (overhead + (pf_path if pf_path > path else path))
        if (c_dec if c_dec > m_dec else m_dec) > 0.0:  # share 0.0: step_time's two halves add 0.0, then total
            gpu = head + layers * total
        else:
            gpu = head + layers * (total * 0.5) + layers * (total * (1.0 - 0.5))
        gpu = gpu + tail0 + tail1 + tail2
        times.append(gpu + (max(0.0, cpu0 - gpu) if async_ else cpu0))
        dec_keys += n
        longest += 1
    return times


def _steps(f: _Fixed, n: int, dec_keys: np.ndarray, longest: np.ndarray) -> np.ndarray:
    """`_step_times` over arrays of steps."""
    keys = dec_keys if f.alpha is None else dec_keys + f.alpha * (n * longest - dec_keys)
    hx, tile, s_per_flop = f.hx_tile_flop
    c_dec = hx * keys * tile * s_per_flop
    m_dec = f.d * (f.q_term + 2.0 * keys * f.kv_gpu) * f.s_per_byte
    compute, memory = f.c_pf + c_dec, f.m_pf + m_dec
    if f.waves is not None:  # _path over the steps: waves and unit length move per key block of the longest
        block = f.waves[4]
        blocks, where = np.unique(np.maximum(-(-longest // block), 1), return_inverse=True)
        units = np.array([_units(f.waves, int(b)) for b in blocks.tolist()], dtype=np.int64)[where]
        mean_blocks = np.maximum(np.ceil(dec_keys / f.waves[0] / block), 1.0).astype(np.int64)
        mean = -(-mean_blocks // units[:, 2])
        longest = (((units[:, 0] - 1) * mean + units[:, 1]) * block).astype(np.float64)
    path = longest * f.s_per_key
    total = np.where(compute > memory, compute, memory) + (f.overhead + np.where(f.pf_path > path, f.pf_path, path))
    alone = np.where(c_dec > m_dec, c_dec, m_dec)
    positive = 0.0 + alone > 0.0
    share = np.where(positive, 0.0 / np.where(positive, 0.0 + alone, 1.0), 0.5)
    gpu = f.head + f.layers * (total * share) + f.layers * (total * (1.0 - share))
    for term in f.tail:
        gpu = gpu + term
    cpu = f.cpu
    if f.async_:
        cpu = cpu - gpu
        cpu = np.where(cpu > 0.0, cpu, 0.0)
    return gpu + cpu
