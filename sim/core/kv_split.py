"""The plain KV cache manager with prefix caching under `free_uncached_first`, its free queue in two parts.

Under `free_uncached_first` (vLLM 0.33) a freed block holding no cached prefix goes to the front of the
free queue, tail block first, and one holding a prefix to the back; allocation takes from the front, and
a prefix hit takes a cached block out of the queue wherever it is. A block gains a hash only while a
request holds it, so the front part holds uncached blocks only, pushed and popped at one end: a stack
(a list whose end is the queue's front). The back part holds the cached ones, in order: a plain dict
(insertion-ordered; its inserts and deletions cost less than an `OrderedDict`'s linked nodes). The queue
reads front part first, then back part: the blocks handed out, and their order, are the plain manager's.
"""
from __future__ import annotations

from itertools import chain, islice

from sim.core.kv_cache import KVCacheManager
from sim.core.request import Request


class SplitFreeQueue:
    """The free queue as `front` (a stack, `front[-1]` first) then `back` (a dict, oldest first). Reads
    as the `OrderedDict` queue does: length, iteration front first, membership, deletion."""

    __slots__ = ("front", "back")

    def __init__(self, num_gpu_blocks: int):
        self.front = list(range(num_gpu_blocks - 1, 0, -1))  # block 1 first; 0 is the null block
        self.back: dict[int, None] = {}

    def __len__(self) -> int:
        return len(self.front) + len(self.back)

    def __iter__(self):
        return chain(reversed(self.front), self.back)

    def __contains__(self, block: int) -> bool:
        return block in self.back or block in self.front

    def __delitem__(self, block: int) -> None:
        if block in self.back:  # a prefix hit: cached blocks sit in the back part
            del self.back[block]
        else:
            self.front.remove(block)


class SplitKVCacheManager(KVCacheManager):
    """`KVCacheManager(num_gpu_blocks, block_size, enable_prefix_caching=True, free_uncached_first=True)`
    with the free queue a `SplitFreeQueue`."""

    def __init__(self, num_gpu_blocks: int, block_size: int):
        super().__init__(num_gpu_blocks, block_size, enable_prefix_caching=True, free_uncached_first=True)

    def _new_free_queue(self, num_gpu_blocks: int) -> SplitFreeQueue:
        return SplitFreeQueue(num_gpu_blocks)

    def _pop_free(self) -> int:
        queue = self.free_queue
        if queue.front:
            block = queue.front.pop()
        else:
            block = next(iter(queue.back))
            del queue.back[block]
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
        front, back = self.free_queue.front, self.free_queue.back
        num_front = min(count, len(front))
        taken = front[len(front) - num_front:]
        del front[len(front) - num_front:]
        taken.reverse()  # front first
        if num_front < count:
            from_back = list(islice(back, count - num_front))
            for block in from_back:
                del back[block]
            taken += from_back
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
        uncached, back = [], self.free_queue.back
        for block in reversed(blocks):
            count = ref_cnt[block] - 1
            ref_cnt[block] = count
            if not count:
                if block_hash[block] is None:
                    uncached.append(block)
                else:
                    back[block] = None
        if uncached:
            uncached.reverse()
            self.free_queue.front += uncached  # the tail block ends at the front
