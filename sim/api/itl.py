"""Inter-token latency (ITL) statistics without pooling every gap.

The ITL of a run is the multiset of the positive gaps between consecutive tokens of its completed
requests (vLLM's serving benchmark pools them; see sim.api.metrics). A million-request run has
hundreds of millions of them, so the gaps are held as weighted chunks, (value in ms, count):

- token times kept as runs (`record_token_times = "runs"`, sim.core.token_runs): inside a run, a
  request's gaps are the gaps between consecutive step start times, so each step gap counts once per
  run that spans it (one byte a step, mostly: the runs spanning each gap counted from a difference
  array over the steps each batch of requests covers), plus the gaps between a request's runs, kept as distinct
  values and counts (requests side by side skip the same steps: vLLM V0's prefill-only steps end every
  decoding request's run);
- token times kept in arrays (or read back otherwise): every gap once, chunk by chunk.

From those: the median and percentiles are order statistics picked out exactly (radix selection on
the floats' bit patterns) and interpolated as numpy's `median` / `percentile` (method "linear") do,
so they equal numpy's on the pooled array bit for bit. The mean and std are exactly rounded: the
sums are kept as exact integers (each float split into 13-bit pieces), mean = round(sum / n) and
std = round(sqrt(population variance)); numpy's pairwise sums over the pooled array can differ from
them in the last bits. Both depend only on the multiset, so every way of keeping token times (and
the fast and step engines, whose records are identical) gives the same figures.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from sim.core.token_runs import MergedTokenTimes, TokenTimes, view

CHUNK = 1 << 18
"""Entries per chunk (values and counts), and the most a selection step gathers at once."""
EXPLICIT = 1 << 20
"""Gaps read one by one are gathered this many at a time, then kept as distinct values and counts."""
REQUESTS = 1 << 13
"""Requests kept as runs read at once (their runs unpacked together)."""
_PIECE = 13  # bits per piece of a 53-bit mantissa in the exact sums
_PIECES = 5


def itl_chunks(token_times, completed) -> list:
    """The positive token gaps of completed requests in ms, as chunks: (values, counts) (counts None:
    one each) or `StepGaps` (read by `each`). `completed`: a bool per request. Merged runs: each
    run's chunks (the multiset does not depend on the order of requests)."""
    if isinstance(token_times, MergedTokenTimes):
        return [c for times, chosen in token_times.split(completed) for c in itl_chunks(times, chosen)]
    chosen = np.flatnonzero(np.asarray(completed, dtype=bool)[:len(token_times)])
    chunks: list = []
    if isinstance(token_times, TokenTimes):
        chosen = _run_chunks(token_times, chosen, chunks)
    _explicit_chunks(token_times, chosen, chunks)
    return chunks


def _explicit_chunks(token_times, chosen, chunks: list) -> None:
    """Each chosen request's gaps read from its times, packed into chunks of distinct values with
    their counts (requests side by side in a batch share their step gaps: a few bytes a gap)."""
    buffer, size = np.empty(EXPLICIT), 0
    for i in chosen:
        times = token_times[int(i)]
        if times is None or len(times) < 2:
            continue
        t = np.asarray(times, dtype=float)
        gaps = t[1:] - t[:-1]
        gaps = gaps[gaps > 0] * 1e3
        while len(gaps):
            take = min(len(gaps), EXPLICIT - size)
            buffer[size:size + take] = gaps[:take]
            size, gaps = size + take, gaps[take:]
            if size == EXPLICIT:
                _append_distinct(chunks, buffer)
                size = 0
    _append_distinct(chunks, buffer[:size])


def _append_distinct(chunks: list, values: np.ndarray) -> None:
    if len(values):
        distinct, counts = np.unique(values, return_counts=True)
        _append(chunks, distinct, counts.astype(np.min_scalar_type(int(counts.max()))))


def _run_chunks(token_times: TokenTimes, chosen: np.ndarray, chunks: list) -> np.ndarray:
    """Chunks of the chosen requests kept as runs with no other times; returns the rest."""
    store = token_times.store
    picked, rest = _kept_as_runs(store, chosen)
    starts = view(store.steps.start_time, np.float64)
    spanning = np.zeros(max(len(starts) - 1, 0), dtype=np.uint8)  # runs spanning the gap after each step
    for lo in range(0, len(picked), REQUESTS):
        spanning = _add_spans(spanning, *_runs_of(store, picked[lo:lo + REQUESTS], starts, chunks))
    for lo in range(0, len(spanning), CHUNK):  # the gaps themselves are read from the steps when needed
        if spanning[lo:lo + CHUNK].any():
            chunks.append(StepGaps(starts, lo, spanning[lo:lo + CHUNK]))
    return rest


def _kept_as_runs(store, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chosen requests split into those kept as runs with no other times, and the rest."""
    simple = view(store.offsets, np.int64)[chosen] >= 0
    if store.others:
        simple &= ~np.isin(chosen, np.fromiter(store.others, dtype=np.int64))
    return chosen[simple], chosen[~simple]


def _add_spans(spanning: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """`spanning` with one more over [first, last) of each run (a difference array over the steps
    these runs cover), in a wider type where a count no longer fits."""
    if not len(first):
        return spanning
    lo, hi = int(first.min()), int(last.max())
    size = hi - lo + 1
    runs = np.cumsum((np.bincount(first - lo, minlength=size) - np.bincount(last - lo, minlength=size))[:-1])
    total = spanning[lo:hi] + runs
    if int(total.max(initial=0)) > np.iinfo(spanning.dtype).max:
        spanning = spanning.astype(np.min_scalar_type(int(total.max())))
    spanning[lo:hi] = total
    return spanning


def _runs_of(store, requests: np.ndarray, starts: np.ndarray, chunks: list):
    """(first, last) step positions of these requests' runs; the gaps between consecutive runs of a
    request (from one run's last token to the next one's first) go to `chunks`, as distinct values."""
    owner, first, last = run_positions(store, requests)
    same = owner[1:] == owner[:-1]
    between = starts[first[1:][same]] - starts[last[:-1][same]]
    _append_distinct(chunks, between[between > 0] * 1e3)
    return first, last


def run_positions(store, requests: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(owner, first, last) of the runs of these requests (compacted, in `store`): the index into
    `requests` each belongs to and the step positions of its first and last token, in order."""
    counts = view(store.counts, np.int32)[requests].astype(np.int64)
    begin = np.cumsum(counts) - counts  # each request's first pair among these requests' pairs
    index = np.repeat(view(store.offsets, np.int64)[requests] - begin, counts) + np.arange(int(counts.sum()))
    pairs = view(store.pairs, np.uint8)
    skip, length = pairs[2 * index].astype(np.int64), pairs[2 * index + 1].astype(np.int64)
    end = np.cumsum(skip + length)
    end += np.repeat(view(store.firsts, np.int64)[requests] - np.concatenate(([0], end))[begin], counts)
    keep = length > 0
    owner = np.repeat(np.arange(len(requests)), counts)[keep]
    return owner, (end - length)[keep], end[keep] - 1


def tokens_per_second(token_times, chosen: np.ndarray, start: float,
                      chunk: int = REQUESTS) -> tuple[np.ndarray, np.ndarray]:
    """Output tokens of the chosen requests (indices) per second from `start`, as (seconds, counts):
    the seconds b, ascending, that hold tokens (times t with floor(t - start) = b, clipped at 0) and
    how many each holds, so memory follows the tokens, not the span of time. Requests kept as runs
    are counted per step position (each of a run's steps holds one of its tokens), the rest from
    their times; `chunk` requests at a time, each chunk's counts added to the others' once, at the
    end (adding each into a running total would cost a pass over every second so far per chunk)."""
    if isinstance(token_times, MergedTokenTimes):
        mask = np.zeros(len(token_times), dtype=bool)
        mask[chosen] = True
        return _add_counts(*(tokens_per_second(times, np.flatnonzero(picked), start, chunk)
                             for times, picked in token_times.split(mask)))
    parts = []
    if isinstance(token_times, TokenTimes):
        store = token_times.store
        picked, chosen = _kept_as_runs(store, chosen)
        starts = view(store.steps.start_time, np.float64)
        for lo in range(0, len(picked), chunk):
            _, first, last = run_positions(store, picked[lo:lo + chunk])
            if len(first):
                low, high = int(first.min()), int(last.max()) + 1
                tokens = np.cumsum(np.bincount(first - low, minlength=high - low + 1)
                                   - np.bincount(last + 1 - low, minlength=high - low + 1))[:-1]
                parts.append(_counted(np.floor(starts[low:high] - start).astype(int).clip(min=0), tokens))
    for lo in range(0, len(chosen), chunk):
        times = [token_times[i] for i in chosen[lo:lo + chunk].tolist()]
        times = [np.asarray(t, dtype=float) for t in times if t is not None]
        if times:
            parts.append(_counted(np.floor(np.concatenate(times) - start).astype(int).clip(min=0)))
    return _add_counts(*parts)


_NO_COUNTS = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def _counted(bins: np.ndarray, weights: np.ndarray | None = None) -> tuple:
    """`bins` counted as (seconds, int64 counts) (`weights`: a count each; exact below 2**53); a second
    whose count is 0 is left out. Bins spread over more seconds than there are bins are counted
    sorted, not in an array over their span."""
    if not len(bins):
        return _NO_COUNTS
    low = int(bins.min())
    if int(bins.max()) - low < 2 * len(bins):
        dense = np.bincount(bins - low, weights=weights).astype(np.int64)
        seconds = np.flatnonzero(dense)
        return seconds + low, dense[seconds]
    seconds, inverse = np.unique(bins, return_inverse=True)
    counts = np.bincount(inverse, weights=weights).astype(np.int64)
    return seconds[counts > 0], counts[counts > 0]


def _add_counts(*parts: tuple) -> tuple:
    """(seconds, counts) parts added up, second by second."""
    seconds = np.unique(np.concatenate([part[0] for part in parts] or [_NO_COUNTS[0]]))
    counts = np.zeros(len(seconds), dtype=np.int64)
    for part_seconds, part_counts in parts:
        counts[np.searchsorted(seconds, part_seconds)] += part_counts  # a part's seconds are distinct
    return seconds.astype(np.int64), counts


class StepGaps:
    """A chunk of step gaps: `spanning[j]` runs span the gap after step `lo + j`."""

    def __init__(self, starts: np.ndarray, lo: int, spanning: np.ndarray):
        self.starts, self.lo, self.spanning = starts, lo, spanning

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.lo, self.lo + len(self.spanning)
        gaps = self.starts[lo + 1:hi + 1] - self.starts[lo:hi]
        keep = (self.spanning > 0) & (gaps > 0)
        return gaps[keep] * 1e3, self.spanning[keep]


def each(chunks):
    """The (values, counts) of every chunk, step gaps read one chunk at a time."""
    for chunk in chunks:
        yield chunk.read() if isinstance(chunk, StepGaps) else chunk


def distinct_counts(chunks) -> tuple[np.ndarray, np.ndarray]:
    """The multiset of (values, counts) `chunks` as its sorted distinct values and their counts
    (int64), merged a few chunks at a time (about as many bytes as distinct values, not as
    entries). The merged parts are kept as a stack whose sizes at least double downwards, each new
    part merged into the top while the top is no larger: merging each batch into all the values so
    far re-sorted every distinct value once a batch (quadratic where nearly every value differs,
    as step gaps do)."""
    stack, batch, size = [], [], 0
    for v, c in each(chunks):
        batch.append((v, np.ones(len(v), dtype=np.int64) if c is None else c.astype(np.int64)))
        size += len(v)
        if size >= 4 * CHUNK:
            _push_distinct(stack, _merge_distinct(batch))
            batch, size = [], 0
    return _merge_distinct([*stack, *batch] or [(np.zeros(0), np.zeros(0, dtype=np.int64))])


def _push_distinct(stack: list, part: tuple) -> None:
    """Put `part` on `stack`, merged with the parts on top no larger than it."""
    while stack and len(stack[-1][0]) <= len(part[0]):
        part = _merge_distinct([stack.pop(), part])
    stack.append(part)


def _merge_distinct(parts) -> tuple[np.ndarray, np.ndarray]:
    distinct, inverse = np.unique(np.concatenate([v for v, _ in parts]), return_inverse=True)
    weights = np.concatenate([c for _, c in parts]).astype(np.float64)  # exact: counts far below 2**53
    return distinct, np.bincount(inverse.ravel(), weights=weights, minlength=len(distinct)).astype(np.int64)


def _append(chunks: list, values: np.ndarray, counts: np.ndarray | None) -> None:
    for lo in range(0, len(values), CHUNK):
        chunks.append((values[lo:lo + CHUNK], None if counts is None else counts[lo:lo + CHUNK]))


def weighted_stats(chunks, percentiles, key) -> dict[str, float]:
    """The statistics of the multiset of (values, counts) `chunks` (values positive), keyed by `key`."""
    n, total, squares = exact_moments(chunks)
    nan = float("nan")
    out = {key("mean"): nan, key("median"): nan, key("std"): nan, **{key(p): nan for p in percentiles}}
    if not n:
        return out
    mean = total / n
    out[key("mean")] = float(mean)
    out[key("median")] = median(chunks, n)
    out[key("std")] = sqrt_rounded(squares / n - mean * mean)
    for p in percentiles:
        out[key(p)] = percentile(chunks, n, p)
    return out


# ----- exact sums ------------------------------------------------------------------------------
def exact_moments(chunks) -> tuple[int, Fraction, Fraction]:
    """(n, sum, sum of squares) of the multiset, exactly."""
    n, linear, square = 0, {}, {}
    for values, counts in each(chunks):
        weights = np.ones(len(values), dtype=np.int64) if counts is None else counts.astype(np.int64)
        n += int(weights.sum())
        step = 1 << max(0, min(16, 33 - int(weights.max(initial=1)).bit_length()))  # no int64 sum overflows
        for lo in range(0, len(values), step):
            _add_sums(values[lo:lo + step], weights[lo:lo + step], linear, square)
    total = sum((Fraction(v) * Fraction(2) ** e for e, v in linear.items()), Fraction(0))
    squares = sum((Fraction(v) * Fraction(2) ** e for e, v in square.items()), Fraction(0))
    return n, total, squares


def _add_sums(values: np.ndarray, weights: np.ndarray, linear: dict, square: dict) -> None:
    """Add sum(w * v) and sum(w * v * v) to the per-exponent integer sums: v = M * 2**(e - 53) with
    M a 53-bit integer in five 13-bit pieces; every product of pieces (and weight) fits an int64."""
    if not len(values):
        return
    fraction, exponent = np.frexp(values)
    order = np.argsort(exponent, kind="stable")
    exponent = exponent[order]
    mantissa = (fraction[order] * float(1 << 53)).astype(np.int64)
    weights = weights[order]
    bounds = np.concatenate(([0], np.flatnonzero(np.diff(exponent)) + 1))
    pieces = [(mantissa >> (_PIECE * i)) & ((1 << _PIECE) - 1) for i in range(_PIECES)]
    weighted = [weights * p for p in pieces]
    sums_1 = [np.add.reduceat(w, bounds) for w in weighted]
    sums_2 = []
    for s in range(2 * _PIECES - 1):
        terms = sum(weighted[i] * pieces[s - i] for i in range(max(0, s - _PIECES + 1), min(s, _PIECES - 1) + 1))
        sums_2.append(np.add.reduceat(terms, bounds))
    for g, e in enumerate(exponent[bounds].tolist()):
        scale = e - 53
        linear[scale] = linear.get(scale, 0) + sum(int(sums_1[i][g]) << (_PIECE * i) for i in range(_PIECES))
        square[2 * scale] = square.get(2 * scale, 0) + sum(int(sums_2[s][g]) << (_PIECE * s)
                                                           for s in range(2 * _PIECES - 1))


def sqrt_rounded(x: Fraction) -> float:
    """The float nearest to sqrt(x) (x >= 0 rational), exactly rounded."""
    if x <= 0:
        return 0.0
    p, q = x.numerator, x.denominator
    k = max(0, (130 - p.bit_length() + q.bit_length()) // 2)
    quotient, remainder = divmod(p << (2 * k), q)
    root = math.isqrt(quotient)  # floor(sqrt(x) * 2**k)
    if remainder or root * root != quotient:
        root |= 1  # sticky bit: the true root lies strictly above `root`, never on a tie
    return math.ldexp(float(root), -k)


# ----- order statistics ------------------------------------------------------------------------
def median(chunks, n: int) -> float:
    """numpy's median of the multiset: the middle value, or the mean of the two middle values."""
    if n % 2:
        return order_statistic(chunks, (n - 1) // 2)
    return (order_statistic(chunks, n // 2 - 1) + order_statistic(chunks, n // 2)) / 2


def percentile(chunks, n: int, p: float) -> float:
    """numpy's percentile (method "linear") of the multiset, computed as numpy computes it."""
    return interpolated(lambda rank: order_statistic(chunks, rank), n, p)


def sorted_percentile(values: np.ndarray, cumulative: np.ndarray, p: float) -> float:
    """numpy's percentile (method "linear") of sorted `values` each repeated as often as the steps
    of `cumulative` (their running counts) say, computed as numpy computes it."""
    return interpolated(lambda rank: float(values[np.searchsorted(cumulative, rank, "right")]),
                        int(cumulative[-1]), p)


def interpolated(at, n: int, p: float) -> float:
    """numpy's percentile (method "linear") of n values, `at(rank)` the value at a 0-based rank."""
    q = float(np.true_divide(p, 100))
    virtual = (n - 1) * q
    below = math.floor(virtual)
    if virtual >= n - 1:
        return at(n - 1)
    below = max(below, 0)
    a, b = at(below), at(below + 1)
    t = virtual - below
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def order_statistic(chunks, rank: int) -> float:
    """The value at 0-based `rank` in the sorted multiset: narrow a range of bit patterns (positive
    floats sort as their int64 patterns) by histograms until its entries are few, then sort those.
    One pass over the chunks a level: a range's histogram also counts its entries per bin, the next
    range's count (the first level's total decides whether the whole multiset is sorted at once)."""
    lo, hi, entries = 0, 1 << 63, None
    while True:
        if hi - lo == 1:
            return float(np.array([lo], dtype=np.int64).view(np.float64)[0])  # every entry left is this value
        if entries is not None and entries <= CHUNK:
            return _pick([_in_range(values, counts, lo, hi) for values, counts in each(chunks)], rank)
        shift = max(0, (hi - lo - 1).bit_length() - 16)
        bins = ((hi - lo - 1) >> shift) + 1
        hist, found = np.zeros(bins), np.zeros(bins, dtype=np.int64)
        for values, counts in each(chunks):
            values, counts = _in_range(values, counts, lo, hi)
            keys = (values.view(np.int64) - lo) >> shift
            hist += np.bincount(keys, weights=counts, minlength=bins)
            found += np.bincount(keys, minlength=bins)
        if entries is None:
            entries = int(found.sum())
            if entries <= CHUNK:
                continue  # (few entries in all: sorted at once)
        cumulative = np.cumsum(hist)  # exact: counts far below 2**53
        b = int(np.searchsorted(cumulative, rank, "right"))
        rank -= int(cumulative[b - 1]) if b else 0
        entries = int(found[b])
        lo, hi = lo + (b << shift), min(hi, lo + ((b + 1) << shift))


def _inside(values: np.ndarray, lo: int, hi: int) -> np.ndarray:
    keys = values.view(np.int64)
    return (keys >= lo) & (keys < hi)


def _in_range(values, counts, lo: int, hi: int):
    """The entries of one chunk in [lo, hi) (a copy, one chunk at a time)."""
    if lo == 0 and hi == 1 << 63:
        return values, counts
    inside = _inside(values, lo, hi)
    return values[inside], None if counts is None else counts[inside]


def _pick(parts, rank: int) -> float:
    values = np.concatenate([v for v, _ in parts])
    counts = np.concatenate([np.ones(len(v), dtype=np.int64) if c is None else c.astype(np.int64) for v, c in parts])
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(counts[order])
    return float(values[order[int(np.searchsorted(cumulative, rank, "right"))]])
