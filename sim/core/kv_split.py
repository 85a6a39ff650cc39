"""The plain KV cache manager with prefix caching under `free_uncached_first`, its free queue in two parts.

Under `free_uncached_first` (vLLM 0.33) a freed block holding no cached prefix goes to the front of the
free queue, tail block first, and one holding a prefix to the back; allocation takes from the front, and
a prefix hit takes a cached block out of the queue wherever it is. A block gains a hash only while a
request holds it, so the front part holds uncached blocks only, pushed and popped at one end: a stack
(a list whose end is the queue's front). The back part holds the cached ones, in order: a list read
from a head index, a prefix hit leaving a stale entry behind (cheaper than an `OrderedDict`'s linked
nodes, and a whole request's cached blocks go back in one `extend`). The queue
reads front part first, then back part: the blocks handed out, and their order, are the plain manager's.
"""
from __future__ import annotations

from itertools import chain, islice

from sim.core.kv_cache import KVCacheManager
from sim.core.request import Request


class SplitFreeQueue:
    """The free queue as `front` (a stack, `front[-1]` first) then the live entries of `back` from
    `head` on (oldest first). A block leaves `back` lazily: `where[block]` is the index of its live
    entry (-1: none), so an entry `back[i]` is live iff `where[back[i]] == i`. Reads as the
    `OrderedDict` queue does: length, iteration front first, membership, deletion."""

    __slots__ = ("front", "back", "head", "where", "num_back")
    #: entries (passed or stale) past which `back` is rebuilt without them
    COMPACT_AFTER = 1024

    def __init__(self, num_gpu_blocks: int):
        self.front = list(range(num_gpu_blocks - 1, 0, -1))  # block 1 first; 0 is the null block
        self.back: list[int] = []
        self.head = 0
        self.where = [-1] * num_gpu_blocks
        self.num_back = 0

    def __len__(self) -> int:
        return len(self.front) + self.num_back

    def __iter__(self):
        where = self.where
        live = (b for i, b in enumerate(islice(self.back, self.head, None), self.head) if where[b] == i)
        return chain(reversed(self.front), live)

    def __contains__(self, block: int) -> bool:
        return self.where[block] >= 0 or block in self.front

    def __delitem__(self, block: int) -> None:
        if self.where[block] >= 0:  # a prefix hit: cached blocks sit in the back part
            self.where[block] = -1
            self.num_back -= 1
        else:
            self.front.remove(block)

    def push_back(self, blocks: list[int]) -> None:
        """Append blocks to the back, in order."""
        back, where = self.back, self.where
        for i, block in enumerate(blocks, len(back)):
            where[block] = i
        back += blocks
        self.num_back += len(blocks)
        if len(back) - self.head > 2 * self.num_back + self.COMPACT_AFTER:  # stale entries of prefix hits
            self._compact()

    def pop_front(self, count: int) -> list[int]:
        """The first `count` blocks (there are that many), taken out, front first."""
        front = self.front
        num_front = min(count, len(front))
        taken = front[len(front) - num_front:]
        del front[len(front) - num_front:]
        taken.reverse()
        if num_front < count:
            back, where, i = self.back, self.where, self.head
            for _ in range(count - num_front):
                block = back[i]
                while where[block] != i:  # a stale entry: skip it
                    i += 1
                    block = back[i]
                where[block] = -1
                taken.append(block)
                i += 1
            self.head = i
            self.num_back -= count - num_front
            if i > self.COMPACT_AFTER and 2 * i > len(back):
                self._compact()
        return taken

    def _compact(self) -> None:
        """Drop the entries before `head` and the stale ones."""
        where = self.where
        live = [b for i, b in enumerate(islice(self.back, self.head, None), self.head) if where[b] == i]
        for i, block in enumerate(live):
            where[block] = i
        self.back, self.head = live, 0


class SplitKVCacheManager(KVCacheManager):
    """`KVCacheManager(num_gpu_blocks, block_size, enable_prefix_caching=True, free_uncached_first=True)`
    with the free queue a `SplitFreeQueue`."""

    def __init__(self, num_gpu_blocks: int, block_size: int):
        super().__init__(num_gpu_blocks, block_size, enable_prefix_caching=True, free_uncached_first=True)

    def _new_free_queue(self, num_gpu_blocks: int) -> SplitFreeQueue:
        return SplitFreeQueue(num_gpu_blocks)

    def _pop_free(self) -> int:
        block = self.free_queue.pop_front(1)[0]
        self._forget_hash(block)
        self.ref_cnt[block] = 1
        return block

    def _forget_hash(self, block: int) -> None:
        """Evict the cached prefix a block taken from the free queue held, if any."""
        old_hash = self.block_hash[block]
        if old_hash is not None:
            if self.more_holders and old_hash in self.more_holders:
                self._evict(old_hash, block)
            else:  # the usual case: it was the only holder
                del self.cached[old_hash]
            self.block_hash[block] = None

    def _pop_free_many(self, count: int) -> list[int]:
        if not count:
            return []
        taken = self.free_queue.pop_front(count)
        block_hash, ref_cnt, cached, more_holders = self.block_hash, self.ref_cnt, self.cached, self.more_holders
        for block in taken:
            old_hash = block_hash[block]
            if old_hash is not None:  # evict the cached prefix it held
                if more_holders and old_hash in more_holders:
                    self._evict(old_hash, block)
                else:
                    del cached[old_hash]
                block_hash[block] = None
            ref_cnt[block] = 1
        return taken

    def free(self, req: Request, forget: bool = False) -> None:
        blocks = self._drop_owner(req, forget)
        if not blocks:
            return
        ref_cnt, block_hash = self.ref_cnt, self.block_hash
        uncached, cached = [], []
        for block in reversed(blocks):
            count = ref_cnt[block] - 1
            ref_cnt[block] = count
            if not count:
                if block_hash[block] is None:
                    uncached.append(block)
                else:
                    cached.append(block)
        self.free_queue.push_back(cached)
        if uncached:
            uncached.reverse()
            self.free_queue.front += uncached  # the tail block ends at the front
