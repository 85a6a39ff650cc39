"""Token times kept as runs (`record_token_times = "runs"`): a few integers per request instead of
8 bytes a token.

Every token time is the end of the step that sampled it, and the engine starts its next step right
then: so nearly every token time is also a value of the steps' `start_time` column (one step later
under sync scheduling, two under async, where the following step is planned one step ahead). While
a request runs its times grow in a plain `array('d')`, as with `record_token_times = true`; once it
has finished and those later steps are recorded, its times become runs of consecutive `start_time`
positions (a request that decodes one token a step has one run from its first token to its last),
plus the few times no step started at (a step before an idle engine), kept as they are. Reading a
request's times back gives the same floats bit for bit.
"""
from __future__ import annotations

from array import array

import numpy as np

#: Finished requests compacted together (their arrays wait until the steps after them are recorded).
BATCH = 32


class TokenRuns:
    """Finished requests' token times as runs over `steps.start_time`.

    `offsets[i]`: where request i's entry starts in `runs` (-1: not compacted). An entry is the
    number of runs k, the number of other times m, their offset in `extras`, then k pairs (first
    `start_time` position, length).
    """

    def __init__(self, steps) -> None:
        self.steps = steps
        self.runs = array("q")
        self.offsets = array("q")
        self.extras = array("d")
        self.pending: list[int] = []

    def add_request(self) -> None:
        self.offsets.append(-1)

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
        starts = np.frombuffer(self.steps.start_time, dtype=np.float64) if len(self.steps.start_time) \
            else np.zeros(0)
        last = starts[-1] if len(starts) else -np.inf
        waiting = []
        for index in self.pending:
            times = token_times[index]
            if times is None:
                continue
            if not final and times and times[-1] > last:
                waiting.append(index)  # the step starting at its last token is not recorded yet
                continue
            self._store(index, np.frombuffer(times, dtype=np.float64) if times else np.zeros(0), starts)
            token_times[index] = None
        self.pending = waiting

    def _store(self, index: int, values: np.ndarray, starts: np.ndarray) -> None:
        at = np.searchsorted(starts, values)
        found = at < len(starts)
        found[found] = starts[at[found]] == values[found]
        at = at[found]
        breaks = np.flatnonzero(np.diff(at) != 1) + 1
        firsts = np.concatenate(([0], breaks)) if len(at) else np.zeros(0, dtype=np.int64)
        lengths = np.diff(np.concatenate((firsts, [len(at)])))
        others = values[~found]
        entry = np.empty(3 + 2 * len(firsts), dtype=np.int64)
        entry[:3] = len(firsts), len(others), len(self.extras)
        entry[3::2], entry[4::2] = at[firsts], lengths
        self.offsets[index] = len(self.runs)
        self.runs.frombytes(entry.tobytes())
        self.extras.frombytes(others.tobytes())

    def times(self, index: int) -> array | None:
        """Request `index`'s token times as compacted, or None if it was not."""
        offset = self.offsets[index]
        if offset < 0:
            return None
        runs, starts = self.runs, self.steps.start_time
        count, num_others, at = runs[offset], runs[offset + 1], runs[offset + 2]
        out = array("d")
        for k in range(count):
            first, length = runs[offset + 3 + 2 * k], runs[offset + 4 + 2 * k]
            out.extend(starts[first:first + length])
        if num_others:
            out.extend(self.extras[at:at + num_others])
            out = array("d", sorted(out))  # times never decrease: sorting restores their order
        return out

    def nbytes(self) -> int:
        """Bytes held by the store's arrays."""
        return sum(a.itemsize * len(a) for a in (self.runs, self.offsets, self.extras))


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
