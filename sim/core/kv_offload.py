"""A second KV tier in host memory, as vLLM 0.19's offloading connector keeps one (`--kv-offloading-size`).

`CPUOffloadKVCacheManager` is the GPU prefix cache (`KVCacheManager`) plus a CPU tier of
`num_cpu_blocks` blocks named by the same chained block hashes (vLLM's OffloadingConnector with its
CPU manager and LRU policy):

- **store, write-through**: every full block a scheduled request's step computes is stored once
  (`prepare_stores`, at planning): not-yet-stored blocks take CPU slots, the least recently used
  loadable block is evicted for each one missing (never one being loaded, nor the request's own);
  when not enough can be evicted the request's store waits for a later step. Then the request's
  blocks in the tier are touched (its first block the most recent). The copy runs after the step's
  compute, beside the next steps.
- **ready only when the storer lets go**: a stored block becomes loadable when the request that
  stored it finishes and its copies are done (its GPU blocks are held until then, `release`) or when
  it is preempted.
- **load, asynchronous**: a waiting request's lookup continues past its GPU hits over the tier's
  loadable blocks (full blocks of all its tokens). With such hits it is admitted without computing:
  it takes GPU blocks for its hits and leaves the queue while they load (vLLM's
  WAITING_FOR_REMOTE_KVS; `parked`). When the load lands (`finish_load`) its blocks are registered,
  it counts them as computed (all but the last token on a whole-prompt hit) and it goes back to the
  front of the waiting queue. A request whose hits are still being loaded for another is passed over
  (`loads_first` None) and stays first in line.

The timing (when copies start and land, what they cost) is the caller's: sim.planning.offload.
Per-tier hit counters count each request's hits when it is first admitted.
"""
from __future__ import annotations

from collections import OrderedDict

from kernels_cost_model.errors import require
from sim.core.kv_cache import KVCacheManager
from sim.core.request import Request, RequestStatus


class CPUOffloadKVCacheManager(KVCacheManager):
    """GPU blocks plus a host-memory tier of block hashes (LRU), filled write-through."""

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_prefix_caching: bool, num_cpu_blocks: int,
                 free_uncached_first: bool = True):
        require(enable_prefix_caching, "enable_prefix_caching", enable_prefix_caching,
                "a CPU KV tier reuses cached prefixes; turn prefix caching on")
        require(isinstance(num_cpu_blocks, int) and num_cpu_blocks >= 1, "num_cpu_blocks", num_cpu_blocks,
                "the CPU tier must hold at least one block")
        super().__init__(num_gpu_blocks, block_size, enable_prefix_caching, free_uncached_first)
        self.num_cpu_blocks = num_cpu_blocks
        self.cpu: OrderedDict[int, bool] = OrderedDict()   # hash -> loadable, least recent first
        self.loads_of: dict[int, int] = {}                 # hash -> loads reading it (not evictable)
        self.pending: dict[Request, list[int]] = {}        # CPU hits of each request's last lookup
        self.waits: set[Request] = set()                   # last lookup hit blocks being loaded
        self.parked: dict[Request, list[int]] = {}         # loading requests -> the hashes they load
        self.gpu_hits_of: dict[Request, int] = {}          # loading requests -> tokens they hit on the GPU
        self.next_store: dict[Request, int] = {}           # blocks of each request stored or tried
        self.storing: dict[Request, list[int]] = {}        # hashes each request stored, not yet loadable
        self.finished: dict[Request, None] = {}            # finished, blocks held until its stores land (in order)
        self.landed: set[Request] = set()                  # loads landed, back in the waiting queue
        self.num_offloaded_blocks = self.num_loaded_blocks = 0
        self.gpu_hit_tokens = self.cpu_hit_tokens = 0

    # ----- lookup ---------------------------------------------------------------------------
    def lookup_prefix(self, req: Request) -> tuple[list[int], int]:
        """GPU hits, then loadable CPU hits continuing the same prefix; tokens cover both.

        A request that holds blocks already (its load landed) looks nothing up."""
        if req in self.req_blocks:
            return [], 0
        hits, num_tokens = super().lookup_prefix(req)
        self.pending.pop(req, None)
        self.waits.discard(req)
        num_blocks = req.num_tokens // self.block_size
        hashes = self._hashes(req, num_blocks)
        self._touch_cpu(hashes)
        cpu_hits = []
        for block_hash in hashes[len(hits):]:
            if not self.cpu.get(block_hash):
                break
            cpu_hits.append(block_hash)
        if any(self.loads_of.get(h) for h in cpu_hits):
            self.waits.add(req)           # loaded for another request now: wait for it
        elif cpu_hits:
            self.pending[req] = cpu_hits
        return hits, num_tokens + len(cpu_hits) * self.block_size

    def lookup_gpu_prefix(self, req: Request) -> tuple[list[int], int]:
        return KVCacheManager.lookup_prefix(self, req)

    def loads_first(self, req: Request) -> bool | None:
        """True if `req`'s last lookup hit the CPU tier (it loads before computing); None if it must wait
        for another request's load of the same blocks."""
        if req in self.waits:
            return None
        return req in self.pending

    def _touch_cpu(self, hashes: list[int]) -> None:
        cpu = self.cpu
        for block_hash in reversed(hashes):
            if block_hash in cpu:
                cpu.move_to_end(block_hash)

    def _blocks_to_take(self, req: Request, num_new_tokens: int, cached_blocks) -> tuple[int, int]:
        extra = len(self.pending.get(req, ())) * self.block_size  # CPU hits need GPU blocks too
        return super()._blocks_to_take(req, num_new_tokens + extra, cached_blocks)

    def allocate(self, req: Request, num_new_tokens: int, cached_blocks: list[int] = ()) -> list[int] | None:
        first = req.status == RequestStatus.WAITING   # as Request.num_cached_tokens counts
        new_blocks = super().allocate(req, num_new_tokens, cached_blocks)
        if new_blocks is not None:
            self.landed.discard(req)
        if new_blocks is not None and first:
            self.gpu_hit_tokens += len(cached_blocks) * self.block_size
        return new_blocks

    # ----- load -----------------------------------------------------------------------------
    def start_load(self, req: Request, cached_blocks: list[int]) -> bool:
        """Give `req` its GPU hits and fresh blocks for its CPU hits, unregistered until they land.
        False (nothing changes) if the blocks do not fit."""
        cpu_hits = self.pending[req]
        fresh, revived = KVCacheManager._blocks_to_take(self, req, len(cpu_hits) * self.block_size, cached_blocks)
        if fresh + revived > len(self.free_queue):
            return False
        blocks = self.req_blocks.setdefault(req, [])
        self._touch_many(cached_blocks)
        blocks.extend(cached_blocks)
        blocks.extend(self._pop_free_many(fresh))
        del self.pending[req]
        for block_hash in cpu_hits:
            self.loads_of[block_hash] = self.loads_of.get(block_hash, 0) + 1
        self.parked[req] = cpu_hits
        self.gpu_hits_of[req] = len(cached_blocks) * self.block_size
        self.num_loaded_blocks += len(cpu_hits)
        return True

    def finish_load(self, req: Request) -> None:
        """`req`'s load landed: register its blocks and count them as computed."""
        self._end_load(req)
        self.landed.add(req)
        loaded = len(self.req_blocks[req]) * self.block_size
        self.cache_full_blocks(req, loaded)
        computed = req.num_computed_tokens = min(loaded, req.num_tokens - 1)  # a whole hit recomputes its last
        on_gpu = min(self.gpu_hits_of.pop(req), computed)
        if req.status == RequestStatus.WAITING:
            req.num_cached_tokens = computed
            self.gpu_hit_tokens += on_gpu
            self.cpu_hit_tokens += computed - on_gpu

    def _end_load(self, req: Request) -> None:
        """`req` no longer loads: the CPU blocks it read may be evicted again (once no other load reads them)."""
        for block_hash in self.parked.pop(req):
            self.loads_of[block_hash] -= 1
            if not self.loads_of[block_hash]:
                del self.loads_of[block_hash]

    # ----- store ----------------------------------------------------------------------------
    def prepare_stores(self, scheduled: list) -> list[tuple[Request, int]]:
        """The blocks each scheduled (request, tokens) row fills that go to the tier (write-through);
        rows with nothing to store are left out."""
        stores = []
        for req, n in scheduled:
            num_blocks = min(req.num_computed_tokens + n, req.num_tokens) // self.block_size
            start = self.next_store.get(req, 0)
            if num_blocks <= start:
                continue
            hashes = self._hashes(req, num_blocks)
            new = [h for h in hashes[start:] if h not in self.cpu]
            if not self._make_room(len(new), hashes[start:]):
                continue                  # no room now: tried again at its next step
            self.next_store[req] = num_blocks
            if not new:
                continue
            for block_hash in new:
                self.cpu[block_hash] = False
            self._touch_cpu(hashes)
            self.storing.setdefault(req, []).extend(new)
            self.num_offloaded_blocks += len(new)
            stores.append((req, len(new)))
        return stores

    def _make_room(self, needed: int, protected: list[int]) -> bool:
        """Evict least recently used loadable blocks (not being loaded, not `protected`) until `needed`
        slots are free; False, evicting nothing, if there are not enough."""
        short = needed - (self.num_cpu_blocks - len(self.cpu))
        if short <= 0:
            return True
        keep, victims = set(protected), []
        for block_hash, loadable in self.cpu.items():
            if loadable and block_hash not in self.loads_of and block_hash not in keep:
                victims.append(block_hash)
                if len(victims) == short:
                    break
        if len(victims) < short:
            return False
        for block_hash in victims:
            del self.cpu[block_hash]
        return True

    def _stores_land(self, req: Request) -> None:
        """`req`'s stored blocks become loadable."""
        for block_hash in self.storing.pop(req, ()):
            if block_hash in self.cpu:
                self.cpu[block_hash] = True

    # ----- leaving ----------------------------------------------------------------------------
    def free(self, req: Request, forget: bool = False) -> None:
        """A preempted request's stores become loadable and its blocks go; a finished one that stored
        blocks keeps its blocks until `release`; a parked one (aborted) drops its load."""
        self.pending.pop(req, None)
        self.waits.discard(req)
        self.landed.discard(req)
        if req in self.parked:
            del self.gpu_hits_of[req]
            self._end_load(req)
        if req.is_finished:
            self.next_store.pop(req, None)
            if req in self.storing:
                self.finished[req] = None
                return
        else:
            self._stores_land(req)
        super().free(req, forget)

    def release(self, req: Request) -> None:
        """A finished request's stores landed: they become loadable and its blocks go."""
        self.finished.pop(req, None)
        self._stores_land(req)
        super().free(req, forget=True)

    def is_loading(self, req: Request) -> bool:
        return req in self.parked

    def holds_outside_queues(self, req: Request) -> bool:
        return req in self.parked or req in self.finished or req in self.landed


def check_cpu_tier(kv: CPUOffloadKVCacheManager) -> None:
    """The CPU tier never exceeds its blocks; blocks being loaded are loadable and in the tier; no
    running request is still loading."""
    from sim.core.invariants import InvariantError
    if len(kv.cpu) > kv.num_cpu_blocks:
        raise InvariantError(f"CPU tier holds {len(kv.cpu)} blocks, over num_cpu_blocks={kv.num_cpu_blocks}")
    for block_hash in kv.loads_of:
        if not kv.cpu.get(block_hash):
            raise InvariantError(f"block {block_hash} is being loaded but is not loadable in the CPU tier")
    for req in kv.parked:
        if req.status == RequestStatus.RUNNING:
            raise InvariantError(f"{req.request_id} runs while its CPU hits load")
