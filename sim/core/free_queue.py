"""vLLM's free block queue as a deque: allocation takes from the front, freed blocks join an end.

The KV cache manager's free queue is an ordered set of block ids. Nearly every move is at an end: a
prompt takes tens of blocks off the front, a finished request puts its blocks back at the back (or, for
blocks holding no cached prefix, at the front). Only a prefix hit on a cached free block takes one out
of the middle. An `OrderedDict` does each move through a hash lookup and a linked node, and over a large
cache those touch memory all over the heap; a deque touches only its ends. A block taken out of the
middle leaves its entry behind, *stale*, and the front skips it when it gets there.

A block's stale entries always come before its live one. A block taken back out held a cached
prefix, and when freed again it still does (a block loses its hash only when it is allocated afresh), so
it returns to the back; only blocks with no cached prefix go to the front, and those are never taken
back out. `push_front` checks this, and rewrites the deque without stale entries where it fails.
"""
from __future__ import annotations

from collections import deque
from itertools import repeat, starmap

#: Rewrite the deque without its stale entries once they outnumber the live ones by this many.
STALE_SLACK = 4096


class FreeBlockQueue:
    """The free blocks, front first: iteration and length read as the `OrderedDict` queue did;
    `pop_front`, `pop_front_many`, `take_out` (`take_out_many`), `push_back`, `push_front` are its moves."""

    __slots__ = ("entries", "stale", "num_stale", "count")

    def __init__(self, num_gpu_blocks: int):
        self.entries = deque(range(1, num_gpu_blocks))  # block 0 is vLLM's null block, never free
        self.stale = [0] * num_gpu_blocks  # per block: its stale entries in `entries`
        self.num_stale = 0                 # stale entries in all
        self.count = num_gpu_blocks - 1    # live entries: the free blocks

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        """The free blocks, front first (a block's first `stale[block]` entries are stale)."""
        if not self.num_stale:
            yield from self.entries
            return
        stale, skipped = self.stale, {}
        for block in self.entries:
            if stale[block]:
                done = skipped.get(block, 0)
                if done < stale[block]:
                    skipped[block] = done + 1
                    continue
            yield block

    def pop_front(self) -> int:
        """Take the front block."""
        block = self.entries.popleft()
        if self.num_stale:
            stale = self.stale
            while stale[block]:
                stale[block] -= 1
                self.num_stale -= 1
                block = self.entries.popleft()
        self.count -= 1
        return block

    def pop_front_many(self, count: int) -> list[int]:
        """Take `count` blocks (at most `len(self)`) off the front, front first."""
        self.count -= count
        if self.num_stale:
            return self._pop_past_stale(count)
        return list(starmap(self.entries.popleft, repeat((), count)))  # (`count` popleft calls, looped in C)

    def _pop_past_stale(self, count: int) -> list[int]:
        """`count` `pop_front` calls' blocks, in one loop (a preempted request's readmission hits its
        blocks in the middle of the queue, and the pops that follow meet their stale entries)."""
        popleft, stale, taken = self.entries.popleft, self.stale, []
        append, skipped = taken.append, 0
        for _ in range(count):
            block = popleft()
            while stale[block]:
                stale[block] -= 1
                skipped += 1
                block = popleft()
            append(block)
        self.num_stale -= skipped
        return taken

    def take_out(self, block: int) -> None:
        """Take a free block out of the queue wherever it is (its entry turns stale)."""
        self.stale[block] += 1
        self.num_stale += 1
        self.count -= 1
        if self.num_stale > self.count + STALE_SLACK:
            self._drop_stale()

    def take_out_many(self, blocks: list[int]) -> None:
        """`take_out` each of `blocks` (free, distinct), the stale entries' rewrite checked once at
        the end: it changes no block's place, and the check that fires midway fires at the end too."""
        stale = self.stale
        for block in blocks:
            stale[block] += 1
        self.num_stale += len(blocks)
        self.count -= len(blocks)
        if self.num_stale > self.count + STALE_SLACK:
            self._drop_stale()

    def push_back(self, blocks: list[int]) -> None:
        """Put freed blocks at the back, in order."""
        self.entries.extend(blocks)
        self.count += len(blocks)

    def push_front(self, blocks: list[int]) -> None:
        """Put freed blocks at the front so that the queue then starts with `blocks`, in order."""
        if self.num_stale and any(self.stale[block] for block in blocks):
            self._drop_stale()  # (never seen: a block with a stale entry holds a cached prefix)
        self.entries.extendleft(reversed(blocks))
        self.count += len(blocks)

    def _drop_stale(self) -> None:
        self.entries = deque(list(self))
        self.stale = [0] * len(self.stale)
        self.num_stale = 0
