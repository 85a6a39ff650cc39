"""A second KV tier in host memory, as vLLM's offloading connector and LMCache use one.

`CPUOffloadKVCacheManager` is the GPU prefix cache (`KVCacheManager`) plus a CPU tier of
`num_cpu_blocks` blocks named by the same chained block hashes:

- **offload**: when allocation evicts a cached GPU block (its hash would be forgotten), the block's
  KV moves to the CPU tier (least recently used CPU block dropped when full). The copy runs in the
  background (device-to-host DMA beside compute), so it costs no step time.
- **reload**: a prefix lookup continues past the GPU hits into the CPU tier; CPU hits count as cached
  tokens, and the allocation that admits the request takes fresh GPU blocks for them, fills them and
  registers their hashes. The blocks loaded since the last step are handed to the caller
  (`take_loaded_blocks`), which prices the host-to-device copy into that step (a blocking load
  before the request computes, as LMCache's retrieve does).

Per-tier hit counters count each request's hits when it is first admitted.
"""
from __future__ import annotations

from collections import OrderedDict

from kernels_cost_model.errors import require
from sim.core.kv_cache import KVCacheManager
from sim.core.request import Request, RequestStatus


class CPUOffloadKVCacheManager(KVCacheManager):
    """GPU blocks plus a host-memory tier of block hashes (LRU)."""

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_prefix_caching: bool, num_cpu_blocks: int,
                 free_uncached_first: bool = True):
        require(enable_prefix_caching, "enable_prefix_caching", enable_prefix_caching,
                "a CPU KV tier reuses cached prefixes; turn prefix caching on")
        require(isinstance(num_cpu_blocks, int) and num_cpu_blocks >= 1, "num_cpu_blocks", num_cpu_blocks,
                "the CPU tier must hold at least one block")
        super().__init__(num_gpu_blocks, block_size, enable_prefix_caching, free_uncached_first)
        self.num_cpu_blocks = num_cpu_blocks
        self.cpu: OrderedDict[int, None] = OrderedDict()   # hashes in host memory, least recent first
        self.pending: dict[Request, list[int]] = {}        # CPU hits of each request's last lookup
        self.loaded_since_take = 0
        self.num_offloaded_blocks = self.num_loaded_blocks = 0
        self.gpu_hit_tokens = self.cpu_hit_tokens = 0

    # ----- offload on eviction ------------------------------------------------------------
    def _pop_free(self) -> int:
        old_hash = self.block_hash[next(iter(self.free_queue))]
        block = super()._pop_free()
        if old_hash is not None:
            self._store(old_hash)
        return block

    def _store(self, block_hash: int) -> None:
        if block_hash in self.cpu:
            self.cpu.move_to_end(block_hash)
            return
        if len(self.cpu) >= self.num_cpu_blocks:
            self.cpu.popitem(last=False)
        self.cpu[block_hash] = None
        self.num_offloaded_blocks += 1

    # ----- reload on a prefix hit ------------------------------------------------------------
    def lookup_prefix(self, req: Request) -> tuple[list[int], int]:
        """GPU hits, then CPU hits continuing the same prefix; tokens cover both."""
        hits, num_tokens = super().lookup_prefix(req)
        max_blocks = (req.num_tokens - 1) // self.block_size
        cpu_hits = []
        for block_hash in self._hashes(req, max_blocks)[len(hits):max_blocks]:
            if block_hash not in self.cpu:
                break
            cpu_hits.append(block_hash)
        if cpu_hits:
            self.pending[req] = cpu_hits
        else:
            self.pending.pop(req, None)
        return hits, num_tokens + len(cpu_hits) * self.block_size

    def _blocks_to_take(self, req: Request, num_new_tokens: int, cached_blocks) -> tuple[int, int]:
        extra = len(self.pending.get(req, ())) * self.block_size  # CPU hits need GPU blocks too
        return super()._blocks_to_take(req, num_new_tokens + extra, cached_blocks)

    def allocate(self, req: Request, num_new_tokens: int, cached_blocks: list[int] = ()) -> list[int] | None:
        cpu_hits = self.pending.get(req, ())
        for block_hash in cpu_hits:
            self.cpu.move_to_end(block_hash)  # not evicted by this allocation's own offloads
        first = req.status == RequestStatus.WAITING   # as Request.num_cached_tokens counts
        new_blocks = super().allocate(req, num_new_tokens, cached_blocks)
        if new_blocks is None:
            return None
        if first:
            self.gpu_hit_tokens += len(cached_blocks) * self.block_size
            self.cpu_hit_tokens += len(cpu_hits) * self.block_size
        if cpu_hits:
            del self.pending[req]
            known = (len(cached_blocks) + len(cpu_hits)) * self.block_size + num_new_tokens
            self.cache_full_blocks(req, min(req.num_computed_tokens + known, req.num_tokens))  # reloaded: cached
            self.loaded_since_take += len(cpu_hits)
            self.num_loaded_blocks += len(cpu_hits)
        return new_blocks

    def take_loaded_blocks(self) -> int:
        """Blocks reloaded from CPU since the last call (the step being planned loads them)."""
        n, self.loaded_since_take = self.loaded_since_take, 0
        return n

    def free(self, req: Request, forget: bool = False) -> None:
        self.pending.pop(req, None)
        super().free(req, forget)


def check_cpu_tier(kv: CPUOffloadKVCacheManager) -> None:
    """The CPU tier never exceeds its blocks; every running request's pending hits were consumed."""
    from sim.core.invariants import InvariantError
    if len(kv.cpu) > kv.num_cpu_blocks:
        raise InvariantError(f"CPU tier holds {len(kv.cpu)} blocks, over num_cpu_blocks={kv.num_cpu_blocks}")
    for req in kv.pending:
        if req in kv.req_blocks and req.status == RequestStatus.RUNNING:
            raise InvariantError(f"{req.request_id} runs with unloaded CPU hits")
