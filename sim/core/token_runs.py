"""Token times kept as runs (`record_token_times = "runs"`): a few integers per request instead of
8 bytes a token.

Every token time is the end of the step that sampled it. The store keeps those step ends once, on a
shared timeline (each distinct time at which a step finished, increasing). While a request runs its
times grow in a plain `array('d')`, as with `record_token_times = true`; when it finishes they become
runs of consecutive timeline positions: a request that decodes one token a step has one run from its
first token to its last (two or three around a preemption). Reading a request's times back gives the
same floats bit for bit; a request whose times are not all on the timeline keeps its array.
"""
from __future__ import annotations

from array import array

import numpy as np


class TokenRuns:
    """The timeline and the finished requests' runs.

    `timeline`: distinct step end times, increasing. `offsets[i]`: where request i's runs start in
    `runs` (-1: not compacted); there `runs` holds the number of runs k, then k pairs (first
    timeline position, length).
    """

    def __init__(self) -> None:
        self.timeline = array("d")
        self.runs = array("q")
        self.offsets = array("q")

    def add_request(self) -> None:
        self.offsets.append(-1)

    def note(self, now: float) -> None:
        """A step finished at `now` (tokens it sampled carry this time)."""
        timeline = self.timeline
        if not timeline or timeline[-1] != now:
            timeline.append(now)

    def note_many(self, times: list) -> None:
        """Steps finished at `times` (increasing), e.g. a leap's stretch."""
        for now in times:
            self.note(now)

    def compact(self, index: int, times: array) -> bool:
        """Store request `index`'s times as runs; False (nothing stored) if one is not on the timeline."""
        if not times:
            self.offsets[index] = len(self.runs)
            self.runs.append(0)
            return True
        values = np.frombuffer(times, dtype=np.float64)
        line = np.frombuffer(self.timeline, dtype=np.float64)
        at = np.searchsorted(line, values)
        if at[-1] >= len(line) or not np.array_equal(line[at], values):
            return False
        breaks = np.flatnonzero(np.diff(at) != 1) + 1
        starts = np.concatenate(([0], breaks))
        lengths = np.diff(np.concatenate((starts, [len(at)])))
        pairs = np.empty(2 * len(starts), dtype=np.int64)
        pairs[0::2], pairs[1::2] = at[starts], lengths
        self.offsets[index] = len(self.runs)
        self.runs.append(len(starts))
        self.runs.frombytes(pairs.tobytes())
        return True

    def times(self, index: int) -> array | None:
        """Request `index`'s token times as compacted, or None if it was not."""
        offset = self.offsets[index]
        if offset < 0:
            return None
        count = self.runs[offset]
        out = array("d")
        line = self.timeline
        for k in range(count):
            first, length = self.runs[offset + 1 + 2 * k], self.runs[offset + 2 + 2 * k]
            out.extend(line[first:first + length])
        return out

    def nbytes(self) -> int:
        """Bytes held by the store's arrays."""
        return sum(a.itemsize * len(a) for a in (self.timeline, self.runs, self.offsets))


class TokenTimes:
    """Every request's token times as a read-only sequence (`array('d')` or None per request): live
    arrays where a request was not compacted, runs read back where it was."""

    def __init__(self, live: list, runs: TokenRuns):
        self.live, self.store = live, runs

    def __len__(self) -> int:
        return len(self.live)

    def __getitem__(self, index: int):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        times = self.store.times(index if index >= 0 else index + len(self))
        return self.live[index] if times is None else times

    def __iter__(self):
        for index in range(len(self.live)):
            yield self[index]
