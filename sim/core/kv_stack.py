"""The plain KV cache manager without prefix caching, its free queue a stack.

Without prefix caching no block keeps a hash, so under `free_uncached_first` (vLLM 0.33) every freed
block goes to the front of the free queue, tail block first, and allocation takes from the front: the
queue is a stack. Held as a list whose end is the queue's front, a prompt's blocks come off in one slice
and a finished request's go back in one `extend`, where the plain manager's queue (`sim.core.free_queue`)
pops and pushes each block. The blocks handed out, and their order, are the plain manager's.
"""
from __future__ import annotations

from sim.core.kv_cache import KVCacheManager
from sim.core.request import Request


class FreeBlockStack:
    """The free queue as a stack: `blocks[-1]` is its front. Reads as the plain manager's queue does:
    length, iteration front first, membership, and deletion (a block taken back out of the queue)."""

    __slots__ = ("blocks",)

    def __init__(self, num_gpu_blocks: int):
        self.blocks = list(range(num_gpu_blocks - 1, 0, -1))  # block 1 at the front; 0 is the null block

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self):
        return reversed(self.blocks)

    def __contains__(self, block: int) -> bool:
        return block in self.blocks

    def __delitem__(self, block: int) -> None:
        self.blocks.remove(block)


class StackedKVCacheManager(KVCacheManager):
    """`KVCacheManager(num_gpu_blocks, block_size, enable_prefix_caching=False,
    free_uncached_first=True)` with the free queue a `FreeBlockStack`."""

    def __init__(self, num_gpu_blocks: int, block_size: int):
        super().__init__(num_gpu_blocks, block_size, enable_prefix_caching=False, free_uncached_first=True)

    def _new_free_queue(self, num_gpu_blocks: int) -> FreeBlockStack:
        return FreeBlockStack(num_gpu_blocks)

    def take_next_block(self, blocks: list[int], total: int) -> bool:
        stack = self.free_queue.blocks
        if total > (len(blocks) + 1) * self.block_size or not stack:
            return False
        block = stack.pop()
        self.ref_cnt[block] = 1
        blocks.append(block)
        return True

    def _pop_free(self) -> int:
        block = self.free_queue.blocks.pop()
        self.ref_cnt[block] = 1
        return block

    def _pop_free_many(self, count: int) -> list[int]:
        if not count:
            return []
        stack = self.free_queue.blocks
        taken = stack[-count:]
        del stack[-count:]
        taken.reverse()  # front first
        ref_cnt = self.ref_cnt
        for block in taken:
            ref_cnt[block] = 1
        return taken

    def free(self, req: Request, forget: bool = False) -> None:
        blocks = self._drop_owner(req, forget)
        if not blocks:
            return
        ref_cnt, freed = self.ref_cnt, []
        for block in blocks:
            count = ref_cnt[block] - 1
            ref_cnt[block] = count
            if not count:
                freed.append(block)
        self.free_queue.blocks.extend(freed)  # the tail block ends at the front
