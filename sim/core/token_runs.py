"""Token times kept as runs (`record_token_times = "runs"`): a few bytes per request instead of
8 bytes a token.

Every token time is the end of the step that sampled it, and the engine starts its next step right
then: so nearly every token time is also a value of the steps' `start_time` column (one step later
under sync scheduling, two under async, where the following step is planned one step ahead). While
a request runs its times grow in a plain `array('d')`, as with `record_token_times = true`; once it
has finished and those later steps are recorded, its times become runs of consecutive `start_time`
positions (a request that decodes one token a step has one run from its first token to its last; a
step it samples nothing in, e.g. vLLM V0's prefill-only steps, ends a run), plus the few times no
step started at (a step before an idle engine), kept as they are. A run is stored as two bytes, how
many positions it skips after the previous run and how many it covers (longer ones split), so a
request takes ~20 bytes plus 2 a run. Reading a request's times back gives the same floats bit for bit.
"""
from __future__ import annotations

from array import array

import numpy as np

#: Finished requests compacted together (their arrays wait until the steps after them are recorded).
BATCH = 128
#: The largest skip or length one pair holds (one byte each); longer ones take several pairs.
PIECE = 255


class TokenRuns:
    """Finished requests' token times as runs over `steps.start_time`.

    Request i (compacted): `firsts[i]` is the position its first run starts at, and its runs are the
    `counts[i]` pairs (skip, length) from `pairs[2 * offsets[i]]` on: each run starts `skip` positions
    after the previous one's end (after `firsts[i]` for the first) and covers `length` positions.
    `offsets[i]` is -1 where request i was not compacted. `others[i]`: its times no step started at.
    """

    def __init__(self, steps) -> None:
        self.steps = steps
        self.pairs = array("B")
        self.offsets = array("q")
        self.firsts = array("q")
        self.counts = array("i")
        self.others: dict[int, array] = {}
        self.pending: list[int] = []

    def add_request(self) -> None:
        self.offsets.append(-1)
        self.firsts.append(0)
        self.counts.append(0)

    def finish(self, index: int, token_times: list) -> None:
        """Request `index` finished: compact it (with others, once the steps after it are recorded)."""
        self.pending.append(index)
        if len(self.pending) >= BATCH:
            self.compact(token_times, final=False)

    def compact(self, token_times: list, final: bool = True) -> None:
        """Compact the finished requests whose times are all on the record (all of them if `final`);
        their slots in `token_times` become None."""
        if not self.pending:
            return
        starts = view(self.steps.start_time, np.float64)
        last = starts[-1] if len(starts) else -np.inf
        waiting, ready = [], []
        for index in self.pending:
            times = token_times[index]
            if times is None:
                continue
            if not final and times and times[-1] > last:
                waiting.append(index)  # the step starting at its last token is not recorded yet
                continue
            ready.append(index)
        if ready:
            self._store(ready, [token_times[index] for index in ready], starts)
            for index in ready:
                token_times[index] = None
        self.pending = waiting

    def _store(self, indices: list, arrays: list, starts: np.ndarray) -> None:
        """Keep requests' times as runs of the positions they start steps at; the others (no step
        started then, or the same time as the token before: several tokens of one step) as they are.
        All the requests in one numpy pass, each request's values a segment of it."""
        lengths = np.fromiter(map(len, arrays), np.int64, len(arrays))
        values = np.frombuffer(b"".join(arrays), np.float64) if lengths.any() else np.zeros(0)
        segment = np.repeat(np.arange(len(arrays)), lengths)
        at = np.searchsorted(starts, values)
        found = at < len(starts)
        found[found] = starts.view(np.int64)[at[found]] == values.view(np.int64)[found]  # same bits (-0.0 is not 0.0)
        later = segment[1:] == segment[:-1]   # a value with one of its own request before it
        found[1:] &= ~(found[:-1] & (at[1:] == at[:-1]) & later)  # a found time's position: taken by the one before
        at, owner = at[found], segment[found]
        new_run = np.ones(len(at), bool)
        new_run[1:] = (np.diff(at) != 1) | (owner[1:] != owner[:-1])
        heads = np.flatnonzero(new_run)
        run_firsts, run_owner = at[heads], owner[heads]
        run_lengths = np.diff(np.append(heads, len(at)))
        first_of_request = np.ones(len(heads), bool)
        first_of_request[1:] = run_owner[1:] != run_owner[:-1]
        skips = run_firsts - np.where(first_of_request, run_firsts, np.append(0, (run_firsts + run_lengths)[:-1]))
        runs_per_request = np.bincount(run_owner, minlength=len(arrays))
        bounds = np.append(0, np.cumsum(runs_per_request)).tolist()
        if len(skips) and max(int(skips.max()), int(run_lengths.max())) > PIECE:
            pieces = [_pairs(run_firsts[a:b], run_lengths[a:b]) for a, b in zip(bounds, bounds[1:])]
        else:
            interleaved = np.empty(2 * len(skips), dtype=np.uint8)
            interleaved[0::2], interleaved[1::2] = skips, run_lengths
            pieces = [interleaved[2 * a:2 * b] for a, b in zip(bounds, bounds[1:])]
        firsts = run_firsts[np.minimum(bounds[:-1], max(len(heads) - 1, 0))].tolist() if len(heads) else []
        for r, index in enumerate(indices):
            self.offsets[index] = len(self.pairs) // 2
            self.firsts[index] = firsts[r] if runs_per_request[r] else 0
            self.counts[index] = len(pieces[r]) // 2
            self.pairs.frombytes(pieces[r].tobytes())
        if not found.all():
            lost = ~found
            for r in np.unique(segment[lost]).tolist():
                self.others[indices[r]] = array("d", values[lost & (segment == r)].tobytes())

    def runs(self, index: int) -> list[tuple[int, int]]:
        """Request `index`'s runs as (first position, length), the pairs of a split run joined."""
        out, end = [], self.firsts[index]
        for skip, length in self._pairs_of(index):
            if out and not skip:
                out[-1][1] += length
            else:
                out.append([end + skip, length])
            end += skip + length
        return [(first, length) for first, length in out if length]

    def times(self, index: int) -> array | None:
        """Request `index`'s token times as compacted, or None if it was not."""
        if self.offsets[index] < 0:
            return None
        starts, out, end = self.steps.start_time, array("d"), self.firsts[index]
        for skip, length in self._pairs_of(index):
            end += skip
            out.extend(starts[end:end + length])
            end += length
        if index in self.others:
            out = array("d", sorted(out + self.others[index]))  # times never decrease: sorting restores their order
        return out

    def _pairs_of(self, index: int):
        """Request `index`'s (skip, length) pairs (none where it was not compacted)."""
        offset = self.offsets[index]
        pairs = self.pairs[2 * offset:2 * (offset + self.counts[index])] if offset >= 0 else array("B")
        return zip(pairs[0::2], pairs[1::2])

    def nbytes(self) -> int:
        """Bytes held by the store's arrays."""
        arrays = (self.pairs, self.offsets, self.firsts, self.counts, *self.others.values())
        return sum(a.itemsize * len(a) for a in arrays)


def view(values: array, dtype) -> np.ndarray:
    """A typed array as numpy, without a copy (an empty one too)."""
    return np.frombuffer(values, dtype=dtype) if len(values) else np.zeros(0, dtype=dtype)


def _pairs(firsts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The runs (first positions, lengths) as interleaved bytes (skip after the previous run, length);
    a skip or a length over PIECE takes several pairs (skips of PIECE with no length, lengths of
    PIECE with no skip)."""
    skips = firsts - np.concatenate((firsts[:1], (firsts + lengths)[:-1]))
    if len(skips) and max(int(skips.max()), int(lengths.max())) > PIECE:
        return np.array([x for s, n in zip(skips.tolist(), lengths.tolist()) for x in _split(s, n)], dtype=np.uint8)
    out = np.empty(2 * len(skips), dtype=np.uint8)
    out[0::2], out[1::2] = skips, lengths
    return out


def _split(skip: int, length: int):
    while skip > PIECE:
        yield from (PIECE, 0)
        skip -= PIECE
    take = min(length, PIECE)
    yield from (skip, take)
    length -= take
    while length:
        take = min(length, PIECE)
        yield from (0, take)
        length -= take


class _TimesSequence:
    """A read-only sequence of per-request token times: subclasses give `__len__` and `_item`."""

    def _item(self, index: int):
        raise NotImplementedError

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        return self._item(index if index >= 0 else index + len(self))

    def __iter__(self):
        for index in range(len(self)):
            yield self._item(index)

    def __eq__(self, other) -> bool:
        """Equal to a sequence (list, another such sequence) holding the same times per request."""
        try:
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        except TypeError:
            return NotImplemented

    __hash__ = None


class TokenTimes(_TimesSequence):
    """Every request's token times as a read-only sequence (`array('d')` or None per request): live
    arrays where a request was not compacted, runs read back where it was."""

    def __init__(self, live: list, runs: TokenRuns):
        self.live, self.store = live, runs

    def __len__(self) -> int:
        return len(self.live)

    def _item(self, index: int):
        times = self.store.times(index)
        return self.live[index] if times is None else times


class MergedTokenTimes(_TimesSequence):
    """Token times of runs side by side (cluster replicas, DP ranks) as one read-only sequence in an
    order of its own: it references each run's sequence (a list or TokenTimes) and copies no times.
    `order[i]`: the position, in the runs' sequences laid end to end, of request i."""

    def __init__(self, parts: list, order) -> None:
        sizes = np.array([len(p) for p in parts], dtype=np.int64)
        order = np.asarray(order, dtype=np.int64)
        self.parts = parts
        self.part = np.repeat(np.arange(len(parts)), sizes)[order].astype(np.min_scalar_type(max(len(parts) - 1, 0)))
        self.local = (order - np.repeat(np.cumsum(sizes) - sizes, sizes)[order]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.part)

    def _item(self, index: int):
        return self.parts[int(self.part[index])][int(self.local[index])]

    def split(self, completed: np.ndarray) -> list:
        """For each run, (its sequence, a bool per its request: chosen by `completed`, a bool per request here)."""
        chosen = np.zeros(len(self), dtype=bool)
        chosen[:len(completed)] = np.asarray(completed, dtype=bool)[:len(self)]
        out = []
        for p, times in enumerate(self.parts):
            mask = np.zeros(len(times), dtype=bool)
            mask[self.local[chosen & (self.part == p)]] = True
            out.append((times, mask))
        return out
