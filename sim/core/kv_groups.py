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
inside the window (or chunk) ending at the hit; a group holding per-request state disables prefix
hits (vLLM's default for mamba-style layers), so such models compute every prompt.
"""
from __future__ import annotations

from kernels_cost_model.kv_layout import KVCacheGroupSpec
from kernels_cost_model.model_shapes import CHUNKED, LINEAR, SLIDING

from sim.core.kv_cache import KVCacheManager
from sim.core.kv_stack import StackedKVCacheManager
from sim.core.request import Request


class HybridKVCacheManager(KVCacheManager):
    """KVCacheManager's interface (lookup_prefix / can_fit / allocate / cache_full_blocks / free)
    over several layer groups; `req_blocks[req]` lists every live block the request holds."""

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_prefix_caching: bool,
                 groups: tuple[KVCacheGroupSpec, ...]):
        super().__init__(num_gpu_blocks, block_size, enable_prefix_caching)
        self.groups = tuple(groups)
        self.has_state = any(g.kind == LINEAR for g in groups)
        self.req_tables: dict[Request, list[list[int | None]]] = {}

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
        """Table length (blocks, None entries included) for `total_tokens` computed tokens."""
        if group.kind == LINEAR:
            return group.state_blocks
        return -(-total_tokens // self.block_size)

    # ----- prefix cache ------------------------------------------------------------------------
    def lookup_prefix(self, req: Request):
        if not self.enable_prefix_caching or self.has_state:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        hashes = self._hashes(req, max_blocks)[:max_blocks]
        hit = max_blocks
        for g, group in enumerate(self.groups):  # full/MLA first bound the hit; windows only shorten it
            if group.kind not in (SLIDING, CHUNKED):
                hit = self._full_hit(g, hashes, hit)
        for g, group in enumerate(self.groups):
            if group.kind in (SLIDING, CHUNKED):
                hit = self._window_hit(g, group, hashes, hit)
        if hit == 0:
            return [], 0
        tables = []
        for g, group in enumerate(self.groups):
            first = self.first_needed_block(group, hit * self.block_size)
            tables.append([None] * first + [self.cached[(g, h)] for h in hashes[first:hit]])
        return tables, hit * self.block_size

    def _full_hit(self, g: int, hashes: list[int], limit: int) -> int:
        for i in range(limit):
            if (g, hashes[i]) not in self.cached:
                return i
        return limit

    def _window_hit(self, g: int, group: KVCacheGroupSpec, hashes: list[int], limit: int) -> int:
        """Longest hit <= limit blocks whose window blocks are all cached in group g."""
        for k in range(limit, 0, -1):
            first = self.first_needed_block(group, k * self.block_size)
            if all((g, h) in self.cached for h in hashes[first:k]):
                return k
        return 0

    # ----- allocation --------------------------------------------------------------------------
    def _plan(self, req: Request, num_new_tokens: int, cached_blocks) -> tuple[int, int, int]:
        """(fresh blocks, cached free blocks revived, blocks freed by the windows first)."""
        tables = self.req_tables.get(req)
        hit_tokens = (len(cached_blocks[0]) * self.block_size) if cached_blocks else 0
        computed = req.num_computed_tokens + hit_tokens
        total = computed + num_new_tokens
        fresh = revived = freed = 0
        for g, group in enumerate(self.groups):
            table = cached_blocks[g] if cached_blocks else (tables[g] if tables else [])
            fresh += max(0, self._needed(group, total) - len(table))
            if group.kind in (SLIDING, CHUNKED) and tables and not cached_blocks:
                first = self.first_needed_block(group, computed)
                freed += sum(1 for b in table[:first] if b is not None and self.ref_cnt[b] == 1)
        if cached_blocks:
            live = {b for table in cached_blocks for b in table if b is not None}
            revived = sum(1 for b in live if self.ref_cnt[b] == 0)
        return fresh, revived, freed

    def can_fit(self, req: Request, num_new_tokens: int, cached_blocks=()) -> bool:
        fresh, revived, freed = self._plan(req, num_new_tokens, cached_blocks)
        return fresh + revived <= len(self.free_queue) + freed

    def allocate(self, req: Request, num_new_tokens: int, cached_blocks=()):
        fresh, revived, freed = self._plan(req, num_new_tokens, cached_blocks)
        if fresh + revived > len(self.free_queue) + freed:
            return None
        tables = self.req_tables.setdefault(req, [[] for _ in self.groups])
        if cached_blocks:
            for g, hit in enumerate(cached_blocks):
                for block in hit:
                    if block is not None:
                        self._touch(block)
                tables[g].extend(hit)
        self._free_outside_windows(req, tables)
        total = req.num_computed_tokens + (len(cached_blocks[0]) * self.block_size if cached_blocks else 0) \
            + num_new_tokens
        new_blocks: list[int] = []
        for group, table in zip(self.groups, tables):
            for _ in range(self._needed(group, total) - len(table)):
                block = self._pop_free()
                table.append(block)
                new_blocks.append(block)
        self.req_blocks[req] = [b for table in tables for b in table if b is not None]
        return new_blocks

    def _free_outside_windows(self, req: Request, tables) -> None:
        computed = req.num_computed_tokens
        for group, table in zip(self.groups, tables):
            if group.kind not in (SLIDING, CHUNKED):
                continue
            for i in range(min(self.first_needed_block(group, computed), len(table))):
                if table[i] is not None:
                    self._release(table[i])
                    table[i] = None

    def _release(self, block: int) -> None:
        self.ref_cnt[block] -= 1
        if self.ref_cnt[block] == 0:
            self.free_queue.push_back([block])

    def cache_full_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        if not self.enable_prefix_caching or self.has_state:
            return
        num_full = (req.num_computed_tokens if num_tokens is None else num_tokens) // self.block_size
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
        for table in tables or ():
            for block in reversed(table):
                if block is not None:
                    self._release(block)


def make_kv_manager(num_gpu_blocks: int, block_size: int, enable_prefix_caching: bool,
                    groups=None, free_uncached_first: bool = True) -> KVCacheManager:
    """The plain manager for one group (or none given; without prefix caching under
    `free_uncached_first`, its stacked form), the hybrid one for several."""
    if groups and len(groups) > 1:
        return HybridKVCacheManager(num_gpu_blocks, block_size, enable_prefix_caching, groups)
    if not enable_prefix_caching and free_uncached_first:
        return StackedKVCacheManager(num_gpu_blocks, block_size)  # the same blocks, a faster free queue
    return KVCacheManager(num_gpu_blocks, block_size, enable_prefix_caching, free_uncached_first)
