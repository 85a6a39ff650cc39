"""Hybrid KV cache: one block pool shared by several layer groups, as vLLM's hybrid KV cache manager.

Each group (kernels_cost_model.kv_layout.KVCacheGroupSpec) keeps its own block table per request,
all drawing from the one pool of `num_gpu_blocks` blocks of the base KVCacheManager:
- full attention and MLA: one block per `block_size` tokens, as the plain manager;
- sliding window: blocks wholly before the window of the next token to compute (the last
  `window - 1` computed tokens) go back to the pool; the table keeps None in their place
  (vLLM's null block);
- chunked local attention (Llama-4): blocks wholly before the current chunk go back likewise;
- linear attention / SSM: `state_blocks` blocks per request for its state, whatever its length.
Prefix caching, per group: full/MLA need every block of the hit; sliding and chunked only the blocks
inside the window (or chunk) ending at the hit; the hit is the longest every group accepts; a group
holding per-request state disables prefix hits (vLLM's Mamba cache mode "none"; its "align" mode, 0.33's
with prefix caching on, is sim.core.kv_mamba_align), so such models compute every prompt. Blocks full with known tokens enter the cache when allocated, before a window
frees them, so a freed block outside the window can still be hit.

As vLLM's `allocate_slots`, an allocation first frees the blocks outside the windows (even if it then
fails), last block first, group by group, then checks the fit and takes new blocks group by group. Two
release behaviours are settings (from the scheduler profile): `frees_processed_only` (vLLM 0.33: a
window frees blocks only behind the tokens whose step has finished, not those in flight under async
scheduling) and `admission_caps` (vLLM 0.33: the whole-sequence admission check counts at most a
window's worth of blocks, plus the tokens in flight, in a sliding or chunked group).

Under speculative decoding (set by `sim.engine.spec_decode.SpecDecoder`) every attention group's table
also covers the lookahead slots, a state group holds 1 + k states per request (vLLM's
`MambaSpec.num_speculative_blocks`), and EAGLE-style drafts change prefix hits as the release does:
under `drop_last_hit_block` (vLLM 0.19) the full-attention hit gives up its last block, and a sliding
group needs one more cached block than its window and then drops it; under `hash_next_tokens` (vLLM
0.33) each block's key covers the token after it in every group.
"""
from __future__ import annotations

import dataclasses

from kernels_cost_model.kv_layout import KVCacheGroupSpec
from kernels_cost_model.model_shapes import CHUNKED, LINEAR, SLIDING

from sim.core.kv_cache import KVCacheManager
from sim.core.kv_stack import StackedKVCacheManager
from sim.core.request import Request
from sim.core.scheduler_profiles import get_scheduler_profile


class HybridKVCacheManager(KVCacheManager):
    """KVCacheManager's interface (lookup_prefix / can_fit / allocate / cache_full_blocks / free)
    over several layer groups; `req_blocks[req]` lists every live block the request holds."""

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_prefix_caching: bool,
                 groups: tuple[KVCacheGroupSpec, ...], free_uncached_first: bool = True,
                 frees_processed_only: bool = False, admission_caps: tuple[int | None, ...] | None = None):
        """`free_uncached_first`: as the plain manager's; `frees_processed_only`: windows free blocks
        behind the processed tokens only (computed less those in flight); `admission_caps`: per group,
        the most blocks the whole-sequence check (`can_fit` of a request holding none) counts, or None."""
        super().__init__(num_gpu_blocks, block_size, enable_prefix_caching, free_uncached_first)
        self.groups = tuple(groups)
        self.no_state_hits = any(g.kind == LINEAR for g in groups)  # (vLLM's Mamba cache mode "none")
        self.req_tables: dict[Request, list[list[int | None]]] = {}
        self.frees_processed_only = frees_processed_only
        self.admission_caps = tuple(admission_caps) if admission_caps else (None,) * len(self.groups)

    # ----- per group rules ---------------------------------------------------------------------
    def require_ever_fits(self, req: Request, tokens: int) -> None:
        """(Budgeted per layer group, not checked here.)"""

    def first_needed_block(self, group: KVCacheGroupSpec, num_computed: int) -> int:
        """Index of the first block the next tokens still attend to (earlier ones can be freed)."""
        if group.kind == SLIDING:
            return max(0, num_computed - group.window + 1) // self.block_size
        if group.kind == CHUNKED:
            return (num_computed // group.window * group.window) // self.block_size
        return 0

    def _needed(self, group: KVCacheGroupSpec, total_tokens: int) -> int:
        """Table length (blocks, None entries included) for `total_tokens` computed tokens and the
        lookahead slots past them (speculative decoding)."""
        if group.kind == LINEAR:
            return group.state_blocks
        return -(-self._with_lookahead(total_tokens) // self.block_size)

    def add_speculative_state(self, num_speculative_tokens: int) -> None:
        """Give each state group's requests one more state per draft, 1 + k states in all (vLLM's
        `MambaSpec.num_speculative_blocks`, which the Mamba layers set from k under any spec method; a
        state of several pool blocks takes as many more). Call it before any request arrives."""
        self.groups = tuple(dataclasses.replace(g, state_blocks=g.state_blocks * (1 + num_speculative_tokens))
                            if g.kind == LINEAR else g for g in self.groups)

    # ----- prefix cache ------------------------------------------------------------------------
    def lookup_prefix(self, req: Request):
        if not self.enable_prefix_caching or self.no_state_hits:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        hashes = self._hashes(req, max_blocks)[:max_blocks]
        hit = max_blocks
        for g, group in enumerate(self.groups):  # full/MLA first bound the hit; windows only shorten it
            if group.kind not in (SLIDING, CHUNKED):
                hit = self._full_hit(g, hashes, hit)
        if self.drop_last_hit_block and hit:
            hit -= 1  # (EAGLE under vLLM 0.19: the last hit block is recomputed for the head)
        kinds: dict[tuple, list[int]] = {}  # window groups of one kind and window are looked up together
        for g, group in enumerate(self.groups):
            if group.kind in (SLIDING, CHUNKED):
                kinds.setdefault((group.kind, group.window), []).append(g)
        firsts = {}
        while True:  # until every kind accepts the hit (vLLM's coordinator: one pass for a single kind)
            before = hit
            for (kind, window), gs in kinds.items():
                hit, firsts[kind, window] = self._window_hit(gs, self.groups[gs[0]], hashes, hit)
            if hit == before or len(kinds) == 1:
                break
        if hit == 0:
            return [], 0
        tables = []
        for g, group in enumerate(self.groups):
            first = min(firsts.get((group.kind, group.window), 0), hit)
            tables.append([None] * first + [self.cached[(g, h)] for h in hashes[first:hit]])
        return tables, hit * self.block_size

    def _full_hit(self, g: int, hashes: list[int], limit: int) -> int:
        for i in range(limit):
            if (g, hashes[i]) not in self.cached:
                return i
        return limit

    def _window_hit(self, gs: list[int], group: KVCacheGroupSpec, hashes: list[int], limit: int) -> tuple[int, int]:
        """(hit, blocks before it left out) for window groups `gs` of one kind, the hit at most `limit`
        blocks. Sliding: the longest hit whose window blocks are cached in every group. Chunked, as
        vLLM's ChunkedLocalAttentionManager.find_longest_cache_hit: the blocks of the chunk holding
        `limit` cached from its start on, the earlier ones counted as hit unlooked (so a shorter hit
        ending in an earlier chunk keeps that chunk's blocks out of its table too)."""
        cached = self.cached
        if group.kind == CHUNKED:
            first = self.first_needed_block(group, limit * self.block_size)
            hit = first
            while hit < limit and all((g, hashes[hit]) in cached for g in gs):
                hit += 1
            return hit, first
        drop = self.drop_last_hit_block  # (EAGLE: one more block must be cached, then it is dropped)
        for k in range(limit, 0, -1):
            first = max(0, self.first_needed_block(group, k * self.block_size) - drop)
            if all((g, h) in cached for g in gs for h in hashes[first:k]):
                k -= drop
                return k, self.first_needed_block(group, k * self.block_size)
        return 0, 0

    # ----- allocation --------------------------------------------------------------------------
    def _processed(self, req: Request) -> int:
        """Tokens behind which the windows free blocks: computed, less those in flight where
        `frees_processed_only`."""
        if self.frees_processed_only:
            return max(0, req.num_computed_tokens - req.num_in_flight_tokens)
        return req.num_computed_tokens

    def _plan(self, req: Request, num_new_tokens: int, cached_blocks, caps=None) -> tuple[int, int, int]:
        """(fresh blocks, cached free blocks revived, blocks the windows would free first); `caps`: per
        group, the most blocks counted for the sequence (None: no cap)."""
        tables = self.req_tables.get(req)
        hit_tokens = (len(cached_blocks[0]) * self.block_size) if cached_blocks else 0
        total = req.num_computed_tokens + hit_tokens + num_new_tokens
        processed = self._processed(req)
        fresh = revived = freed = 0
        for g, group in enumerate(self.groups):
            table = cached_blocks[g] if cached_blocks else (tables[g] if tables else [])
            needed = self._needed(group, total)
            if caps and caps[g] is not None:
                needed = min(needed, caps[g])
            fresh += max(0, needed - len(table))
            if group.kind in (SLIDING, CHUNKED) and tables and not cached_blocks:
                first = self.first_needed_block(group, processed)
                freed += sum(1 for b in table[:first] if b is not None and self.ref_cnt[b] == 1)
        if cached_blocks:
            live = {b for table in cached_blocks for b in table if b is not None}
            revived = sum(1 for b in live if self.ref_cnt[b] == 0)
        return fresh, revived, freed

    def can_fit(self, req: Request, num_new_tokens: int, cached_blocks=()) -> bool:
        """Whether `num_new_tokens` more tokens would fit now; for a request holding no blocks (the
        whole-sequence admission check) window groups count at most their `admission_caps`."""
        caps = self.admission_caps if req not in self.req_tables else None
        fresh, revived, freed = self._plan(req, num_new_tokens, cached_blocks, caps)
        return fresh + revived <= len(self.free_queue) + freed

    def allocate(self, req: Request, num_new_tokens: int, cached_blocks=()):
        tables = self.req_tables.get(req)
        if tables is not None and not cached_blocks:
            self._free_outside_windows(req, tables)  # first, and kept even if the tokens do not fit
        fresh, revived, _ = self._plan(req, num_new_tokens, cached_blocks)
        if fresh + revived > len(self.free_queue):
            return None
        tables, hit_tokens = self._take_hits(req, cached_blocks)
        total = req.num_computed_tokens + hit_tokens + num_new_tokens
        new_blocks: list[int] = []
        for group, table in zip(self.groups, tables):
            for _ in range(self._needed(group, total) - len(table)):
                block = self._pop_free()
                table.append(block)
                new_blocks.append(block)
        self.req_blocks[req] = [b for table in tables for b in table if b is not None]
        if self.enable_prefix_caching:  # blocks full with known tokens enter the cache now (allocate_slots)
            self.cache_full_blocks(req, min(total, req.num_tokens))
        return new_blocks

    def _take_hits(self, req: Request, cached_blocks) -> tuple[list, int]:
        """(the request's tables, its prefix hits appended; the tokens they cover)."""
        tables = self.req_tables.setdefault(req, [[] for _ in self.groups])
        if not cached_blocks:
            return tables, 0
        for g, hit in enumerate(cached_blocks):
            for block in hit:
                if block is not None:
                    self._touch(block)
            tables[g].extend(hit)
        return tables, len(cached_blocks[0]) * self.block_size

    def _free_outside_windows(self, req: Request, tables) -> None:
        """Free each window group's blocks before its window, last first (one release per group)."""
        processed = self._processed(req)
        for group, table in zip(self.groups, tables):
            if group.kind not in (SLIDING, CHUNKED):
                continue
            removed = []
            for i in range(min(self.first_needed_block(group, processed), len(table)) - 1, -1, -1):
                if table[i] is None:
                    break  # (the blocks before it went earlier)
                removed.append(table[i])
                table[i] = None
            self._release(removed)
        self.req_blocks[req] = [b for table in tables for b in table if b is not None]

    def _release(self, blocks: list[int]) -> None:
        """vLLM's `free_blocks` of `blocks` in eviction order: those no request holds any more go to the
        back of the free queue, or, under `free_uncached_first`, those without a cached prefix to the
        front."""
        back, front = [], []
        for block in blocks:
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                (front if self.free_uncached_first and self.block_hash[block] is None else back).append(block)
        self.free_queue.push_back(back)
        if front:
            self.free_queue.push_front(front)

    def hash_next_tokens(self, num_tokens: int) -> None:
        """Key each block's prefix-cache entry with the `num_tokens` tokens after it too, in every group
        (vLLM 0.33 with EAGLE-style drafts; `KVCacheManager.hash_next_tokens`): a block is hit, and
        cached, only once those tokens are known."""
        self.hash_lookahead = num_tokens
        self._hashes = self._hashes_ahead

    def cache_full_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        if not self.enable_prefix_caching or self.no_state_hits:
            return
        known = req.num_computed_tokens if num_tokens is None else num_tokens
        num_full = min(known, req.num_tokens - self.hash_lookahead) // self.block_size
        done = self.num_hashed_blocks.get(req, 0)
        if num_full <= done:
            return
        hashes = self._hashes(req, num_full)
        for g, table in enumerate(self.req_tables[req]):
            for i in range(done, min(num_full, len(table))):
                block = table[i]
                if block is not None and self.block_hash[block] is None:
                    self.block_hash[block] = (g, hashes[i])
                    self._register((g, hashes[i]), block)  # first holder wins
        self.num_hashed_blocks[req] = num_full

    def free(self, req: Request, forget: bool = False) -> None:
        tables = self.req_tables.pop(req, None)
        self.req_blocks.pop(req, None)
        self.num_hashed_blocks.pop(req, None)
        if forget:
            self.req_hashes.pop(req, None)
        for table in tables or ():  # group by group, each last block first
            self._release([block for block in reversed(table) if block is not None])


def make_kv_manager(num_gpu_blocks: int, block_size: int, enable_prefix_caching: bool,
                    groups=None, free_uncached_first: bool = True, *, frees_processed_only: bool = False,
                    admission_caps=None) -> KVCacheManager:
    """The plain manager for one group (or none given; without prefix caching under
    `free_uncached_first`, its stacked form), the hybrid one for several (with the release's
    `frees_processed_only` and `admission_caps`, see `HybridKVCacheManager`)."""
    if groups and len(groups) > 1:
        return HybridKVCacheManager(num_gpu_blocks, block_size, enable_prefix_caching, groups,
                                    free_uncached_first, frees_processed_only, admission_caps)
    if not enable_prefix_caching and free_uncached_first:
        return StackedKVCacheManager(num_gpu_blocks, block_size)  # the same blocks, a faster free queue
    return KVCacheManager(num_gpu_blocks, block_size, enable_prefix_caching, free_uncached_first)


def window_budget_tokens(config) -> int:
    """Tokens beyond its window (or chunk) that a sliding or chunked group budgets for one request, in
    the admission check, the one-request start-up check and the concurrency vLLM reports: 0.33 takes
    its `max_in_flight_tokens`, `max_num_batched_tokens` per concurrent step (two under async
    scheduling; 0.33.0 vllm/config/vllm.py `max_in_flight_tokens`, read by vllm/v1/kv_cache_interface.py
    `max_memory_usage_bytes` of SlidingWindowSpec and ChunkedLocalAttentionSpec); 0.19 one step's
    `max_num_batched_tokens` (0.19.1 kv_cache_interface.py)."""
    profile = get_scheduler_profile(config.scheduler_profile)
    if profile.window_admission_cap:
        return config.max_num_batched_tokens * (2 if config.is_async else 1)
    return config.max_num_batched_tokens


def admission_caps(groups, block_size: int, max_model_len: int, in_flight_tokens: int) -> tuple[int | None, ...]:
    """Per group, the blocks vLLM 0.33's whole-sequence admission check counts at most
    (vllm/v1/kv_cache_interface.py `max_admission_blocks_per_request`): a sliding group the window less
    one plus the tokens in flight (capped at max_model_len) and a block for the window's offset, a
    chunked group a chunk plus the tokens in flight; None for the others."""
    caps = []
    for group in groups:
        if group.kind == SLIDING:
            caps.append(-(-min(group.window - 1 + in_flight_tokens, max_model_len) // block_size) + 1)
        elif group.kind == CHUNKED:
            caps.append(-(-min(group.window + in_flight_tokens, max_model_len) // block_size))
        else:
            caps.append(None)
    return tuple(caps)
