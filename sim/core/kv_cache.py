"""Paged KV cache with prefix caching, as vLLM's V1 KV-cache manager does it.

Blocks hold `block_size` tokens. A request owns a list of blocks covering its computed tokens.
With prefix caching, every full block is named by a chained hash of its token ids (the parent
block's hash and its own tokens); a new request reuses the longest run of cached blocks matching
its prefix. A full block enters the prefix cache when it is allocated for tokens already known (so
two identical prompts admitted in one step share it), as vLLM's `allocate_slots` does. Freed blocks
keep their hash and sit in a free queue: a later hit takes them back, and allocation evicts from the
front. With `free_uncached_first` (vLLM 0.33) freed blocks holding no cached prefix go to the front and
cached ones to the back; otherwise (vLLM 0.19) all go to the back. Block 0 is vLLM's null block, never
allocated: `num_gpu_blocks - 1` blocks are usable. The hashing and registration side is `PrefixCache`'s
(sim.core.kv_prefix), mixed into `KVCacheManager`.
"""
from __future__ import annotations

import struct
from contextlib import contextmanager
from operator import itemgetter

from kernels_cost_model.errors import require
from sim.core.free_queue import FreeBlockQueue
from sim.core.kv_lazy import PrivatePrefixes
from sim.core.kv_prefix import INT32, PrefixCache
from sim.core.request import Request


class KVCacheManager(PrefixCache):
    """Owns every block; the scheduler only calls allocate / free / lookup_prefix."""

    #: tokens prefill chunks must end on (a state model in vLLM's Mamba "align" mode); 0: no constraint
    checkpoint_tokens = 0

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_prefix_caching: bool,
                 free_uncached_first: bool = True):
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.free_uncached_first = free_uncached_first
        self.ref_cnt = [0] * num_gpu_blocks
        #: per block: the prefix hash it holds, None, or (a private request's full block, marked LAZY:
        #: sim.core.kv_lazy) the request that owns it
        self.block_hash: list[int | Request | None] = [None] * num_gpu_blocks
        self.free_queue = self._new_free_queue(num_gpu_blocks)
        #: block hash -> the block holding it that a prefix hit takes (the first registered); further
        #: holders (rare: identical blocks registered twice) in `more_holders`, oldest first
        self.cached: dict = {}
        self.more_holders: dict = {}
        self.req_blocks: dict[Request, list[int]] = {}
        self.req_hashes: dict[Request, list[int]] = {}
        self.num_hashed_blocks: dict[Request, int] = {}
        #: deferred registration of private requests' blocks (`enable_private_prefixes`), and how
        #: many blocks it has marked LAZY (each one cached entry, once hashed)
        self.lazy: PrivatePrefixes | None = None
        self.lazy_blocks = 0
        #: Slots reserved past the scheduled tokens (vLLM's num_lookahead_tokens: the EAGLE or draft
        #: model proposer writes the next drafts' KV there), capped at `max_model_len`.
        self.num_lookahead_tokens = 0
        self.max_model_len: int | None = None
        #: speculative decoding (set by its hook from the scheduler profile): whether a request leaving
        #: the waiting queue with nothing computed gets its lookahead slots at once (vLLM 0.33; 0.19 from
        #: its next step on); whether a prefix hit drops its last block (vLLM 0.19 with EAGLE-style
        #: drafts); tokens after each block its prefix-cache key covers (vLLM 0.33 with EAGLE-style
        #: drafts: 1, so a block is hit, and cached, only once the token after it is known)
        self.admission_lookahead = True
        self.drop_last_hit_block = False
        self.hash_lookahead = 0
        #: `allocate` may take its growth shortcut (a subclass that counts blocks its own way may not)
        self._plain_growth = type(self)._blocks_to_take is KVCacheManager._blocks_to_take
        #: `registers_at` (this class registers and drops blocks as the plain manager does)
        self._registers_at = (enable_prefix_caching and type(self).cache_full_blocks is KVCacheManager.cache_full_blocks
                              and type(self)._cache_blocks is KVCacheManager._cache_blocks
                              and type(self)._drop_owner is KVCacheManager._drop_owner)
        #: one block's token ids as native int32 bytes (the bytes `_int32_bytes` gives), from ints
        self._pack_block = struct.Struct(f"{block_size}{INT32}").pack
        #: int32 token bytes cut into blocks' bytes (1-tuples), in one C loop
        self._split_blocks = struct.Struct(f"{4 * block_size}s").iter_unpack

    def _new_free_queue(self, num_gpu_blocks: int):
        """Every block but the null block, front first (`sim.core.kv_stack` holds it another way)."""
        return FreeBlockQueue(num_gpu_blocks)

    # ----- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (cached-but-free ones included: they are evictable)."""
        return len(self.free_queue)

    @property
    def num_usable_blocks(self) -> int:
        """Every block but the null block."""
        return self.num_gpu_blocks - 1

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - 1 - len(self.free_queue)

    def block_counts(self) -> tuple[int, int, int]:
        """(`num_used_blocks`, `num_cached_hashes`, `num_free_blocks`): a step record's KV columns, in one call."""
        free = len(self.free_queue)
        return self.num_gpu_blocks - 1 - free, len(self.cached) + self.lazy_blocks, free

    @property
    def num_cached_hashes(self) -> int:
        """Distinct prefix hashes cached (blocks marked LAZY count: each is one, once hashed)."""
        return len(self.cached) + self.lazy_blocks

    def enable_private_prefixes(self) -> bool:
        """Defer hashing the blocks of requests no other can hit (sim.core.kv_lazy), where this is the
        plain manager with prefix caching; whether it does. The caller must then pass every request
        that enters through `self.lazy.arrive` before it is scheduled."""
        if self.enable_prefix_caching and type(self) is KVCacheManager and self.lazy is None:
            self.lazy = PrivatePrefixes(self)
        return self.lazy is not None

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks still holding a reusable prefix."""
        return sum(1 for b in self.free_queue if self.block_hash[b] is not None)

    @property
    def grows_in_place(self) -> bool:
        """Whether a running request's growth within the blocks it holds (or by one block,
        `take_next_block`) may skip `allocate` (the plain manager, no lookahead slots): callers then
        inline `allocate`'s hot path."""
        return (self._plain_growth and not self.num_lookahead_tokens
                and type(self).allocate is KVCacheManager.allocate)

    @property
    def registers_at(self) -> bool:
        """Whether callers inlining `allocate`'s growth (`grows_in_place`) may skip the check for a
        full block to register while a request's tokens stay below `req.kv_register_at`: this
        manager raises it only to the next block's end when it registers, and zeroes it when it drops
        the request's blocks. (A registration made elsewhere, e.g. a leap's, only leaves it lower:
        an exact check then, which refreshes it.)"""
        return self._registers_at

    def take_next_block(self, blocks: list[int], total: int) -> bool:
        """`allocate`'s growth by one block, inlined by callers where `grows_in_place`: a running
        request holding `blocks` needs one more block for `total` tokens and a free one exists (no
        cached blocks, no lookahead). Takes it and returns True; else changes nothing."""
        if total > (len(blocks) + 1) * self.block_size or not self.free_queue.count:
            return False
        blocks.append(self._pop_free())
        return True

    def refusal_repeats(self, req: Request) -> bool:
        """Whether a refused admission of waiting `req` repeats while it waits and fewer blocks are free
        than it wants (`Policy._refuse`): this plain manager asks only their count, and `req` hits no
        cached prefix whatever is cached (no prefix caching), or hits only its own marked blocks, free
        ones each taken from the free count as a fresh block would be, and ever fewer while it waits (a
        private request: sim.core.kv_lazy): neither the blocks nor the tokens it wants fall."""
        return type(self) is KVCacheManager and (not self.enable_prefix_caching or req.kv_lazy)

    def new_step_starts(self) -> None:
        """The scheduler begins a step (a manager that keeps per-step state resets it)."""

    def blocks_of(self, req: Request) -> list[int]:
        return self.req_blocks.get(req, [])

    def lookup_gpu_prefix(self, req: Request) -> tuple[list[int], int]:
        """`lookup_prefix` over the GPU cache alone (a tier below it is not consulted)."""
        return self.lookup_prefix(req)

    def loads_first(self, req: Request) -> bool | None:
        """Whether `req`'s last lookup hit blocks it must load before it computes (None: it waits for
        another request's load of them). A tier below the GPU cache says so (sim.core.kv_offload)."""
        return False

    def is_loading(self, req: Request) -> bool:
        """Whether `req` is out of the queues while blocks it hit load (a tier below the GPU cache)."""
        return False

    def holds_outside_queues(self, req: Request) -> bool:
        """Whether `req` may hold blocks while not running (loading, loaded and waiting, or finished
        with copies in flight)."""
        return False

    @contextmanager
    def lookahead_slots(self, num_tokens: int):
        """Allocate and check fits with `num_tokens` lookahead slots inside the block, then restore."""
        kept, self.num_lookahead_tokens = self.num_lookahead_tokens, num_tokens
        try:
            yield
        finally:
            self.num_lookahead_tokens = kept

    # ----- allocation -------------------------------------------------------------------------
    def _blocks_to_take(self, req: Request, num_new_tokens: int, cached_blocks) -> tuple[int, int]:
        """(fresh blocks to allocate, cached free blocks to revive) for `num_new_tokens` more tokens
        after `cached_blocks` prefix hits (whole blocks)."""
        held = len(self.req_blocks.get(req, ()))
        total = req.num_computed_tokens + len(cached_blocks) * self.block_size + num_new_tokens
        if self.num_lookahead_tokens:
            total = self._with_lookahead(total)
        fresh = max(0, -(-total // self.block_size) - held - len(cached_blocks))
        if not cached_blocks:
            return fresh, 0
        if req.kv_lazy:  # its own marked blocks (`PrivatePrefixes.own_hits`): free, every one
            return fresh, len(cached_blocks)
        ref_cnt = self.ref_cnt
        return fresh, [ref_cnt[b] for b in cached_blocks].count(0)

    def _with_lookahead(self, total: int) -> int:
        """`total` tokens and the lookahead slots past them, capped at max_model_len."""
        if not self.num_lookahead_tokens:
            return total
        return max(total, min(total + self.num_lookahead_tokens, self.max_model_len or total))

    def require_ever_fits(self, req: Request, tokens: int) -> None:
        """A named error where `req`'s `tokens` (and the lookahead slots) need more blocks than the cache
        has besides the null block: vLLM's size check counts that block, so a request within a block of
        max_model_len passes it and would preempt itself and be readmitted, or wait, for ever."""
        usable, size = self.num_usable_blocks, self.block_size
        tokens = self._with_lookahead(tokens)
        need = -(-tokens // size)
        require(need <= usable, "engine.num_gpu_blocks", self.num_gpu_blocks,
                f"request {req.request_id!r} needs {need} blocks of {size} tokens for {tokens} tokens; the cache"
                f" has {usable} usable blocks (block 0 is the null block), so it could never run: raise"
                f" num_gpu_blocks or lower max_model_len to {usable * size}")

    def blocks_wanted(self, req: Request, num_new_tokens: int) -> int:
        """Free blocks `num_new_tokens` more tokens of `req` would take (no prefix hits)."""
        return sum(self._blocks_to_take(req, num_new_tokens, ()))

    def can_fit(self, req: Request, num_new_tokens: int, cached_blocks: list[int] = ()) -> bool:
        """Whether `num_new_tokens` more tokens (after `cached_blocks` hits) would fit now."""
        fresh, revived = self._blocks_to_take(req, num_new_tokens, cached_blocks)
        return fresh + revived <= len(self.free_queue)

    def allocate(self, req: Request, num_new_tokens: int, cached_blocks: list[int] = ()) -> list[int] | None:
        """Give `req` blocks for `num_new_tokens` more tokens (after `cached_blocks` prefix hits), and
        cache the blocks those tokens fill with tokens already known.

        Returns the newly allocated blocks, or None if they do not fit (nothing changes then).
        """
        if self._plain_growth and not cached_blocks and not self.num_lookahead_tokens:
            blocks = self.req_blocks.get(req)
            if blocks is not None:  # a running request growing within the blocks it holds: the hot path
                total = req.num_computed_tokens + num_new_tokens
                if total <= len(blocks) * self.block_size:
                    if self.enable_prefix_caching:
                        target = min(total, req.num_tokens)
                        if target // self.block_size > self.num_hashed_blocks.get(req, 0):
                            self.cache_full_blocks(req, target)
                    return []
        fresh, revived = self._blocks_to_take(req, num_new_tokens, cached_blocks)
        if fresh + revived > len(self.free_queue):
            return None
        new_blocks = []
        if req.kv_lazy and fresh and not cached_blocks and req not in self.req_blocks:
            return self._allocate_private(req, fresh, req.num_computed_tokens + num_new_tokens)
        if fresh or cached_blocks:
            blocks = self.req_blocks.setdefault(req, [])
            if cached_blocks:
                self._touch_many(cached_blocks)
                blocks.extend(cached_blocks)
                if req.kv_lazy:  # its own marked blocks (`PrivatePrefixes.own_hits`)
                    self.lazy.rejoin(req, len(cached_blocks))
            new_blocks = self._pop_free_many(fresh)
            blocks.extend(new_blocks)
        if self.enable_prefix_caching and req in self.req_blocks:
            total = req.num_computed_tokens + len(cached_blocks) * self.block_size + num_new_tokens
            self.cache_full_blocks(req, min(total, req.num_tokens))
        return new_blocks

    def _allocate_private(self, req: Request, fresh: int, total: int) -> list[int]:
        """`allocate`'s `fresh` blocks for `total` tokens of a private request holding none (an admission:
        sim.core.kv_lazy), its full blocks marked in the pop's own pass, where `cache_full_blocks` would
        mark them after it (`PrivatePrefixes.mark`: one store a block fewer)."""
        num_full = min(total, req.num_tokens) // self.block_size
        req.kv_lazy_held = None  # (preempted: none of its marked blocks is left)
        new_blocks = self._pop_free_many(fresh, req, num_full)
        self.req_blocks[req] = new_blocks[:]  # (the caller's list is its own, as `allocate` gives it)
        if num_full:
            self.lazy.marked(req, num_full)
        return new_blocks

    def _touch(self, block: int) -> None:
        if self.ref_cnt[block] == 0:
            self.free_queue.take_out(block)
        self.ref_cnt[block] += 1

    def _touch_many(self, blocks) -> None:
        """`_touch` each block in turn (one loop: a prefix hit takes tens of blocks)."""
        if type(self)._touch is not KVCacheManager._touch:
            for block in blocks:
                self._touch(block)
            return
        ref_cnt, idle = self.ref_cnt, []
        for block in blocks:
            count = ref_cnt[block]
            if not count:
                idle.append(block)
            ref_cnt[block] = count + 1
        if idle:  # (the hits are distinct blocks: taken out together, as one by one)
            self.free_queue.take_out_many(idle)

    def _pop_free(self) -> int:
        queue = self.free_queue
        if queue.num_stale:
            block = queue.pop_front()
        else:  # (`FreeBlockQueue.pop_front` with no stale entry, inline: a third call in a decode's block
            block = queue.entries.popleft()  # crossing, after `take_next_block` and this)
            queue.count -= 1
        old_hash = self.block_hash[block]
        if old_hash is not None:
            if type(old_hash) is Request:  # a marked (LAZY) block: its owner. As `PrivatePrefixes.lose`
                # settles them, inline: a call per block cost 5 % of the 4 req/s run; the leaps
                # pop one block at a time
                self.lazy_blocks -= 1
                old_hash.kv_lazy_resident -= 1
                if not old_hash.kv_lazy_resident and old_hash.kv_lazy_blocks is not None:
                    self.lazy.leave(old_hash)
            elif self.more_holders and old_hash in self.more_holders:
                self._evict(old_hash, block)
            else:  # the usual case: it was the only holder
                del self.cached[old_hash]
            self.block_hash[block] = None
        self.ref_cnt[block] = 1
        return block

    def _pop_free_many(self, count: int, marker: Request | None = None, num_marked: int = 0) -> list[int]:
        """`count` blocks off the front of the free queue, as `count` `_pop_free` calls would take
        them (one loop: a prompt takes tens of blocks at once); the first `num_marked` then hold
        `marker` (`_allocate_private`), the rest nothing."""
        if type(self)._pop_free is not KVCacheManager._pop_free:
            return [self._pop_free() for _ in range(count)]
        taken = self.free_queue.pop_front_many(count)
        if num_marked:
            owner, run = self._take_over(taken[:num_marked], marker, None, 0)
            owner, run = self._take_over(taken[num_marked:], None, owner, run)
        else:
            owner, run = self._take_over(taken, None, None, 0)
        if run:
            self.lazy.lose(owner, run)
        return taken

    def _take_over(self, blocks: list[int], fill, owner, run: int) -> tuple:
        """Evict what `blocks` (just off the free queue) held, then store `fill` in their `block_hash`
        entries and a count of 1. A marked block leaves the count; its owner loses its blocks run by
        run (a request's blocks leave together), in this one pass: (`owner`, `run`) is the run in
        progress, carried in and returned."""
        block_hash, ref_cnt, cached = self.block_hash, self.ref_cnt, self.cached
        more_holders = self.more_holders
        for block in blocks:
            old_hash = block_hash[block]
            if old_hash is not None:  # evict the cached prefix it held
                if old_hash is owner:
                    run += 1
                elif type(old_hash) is Request:  # marked: the first of its owner's run
                    if run:
                        self.lazy.lose(owner, run)
                    owner, run = old_hash, 1
                elif more_holders and old_hash in more_holders:
                    self._evict(old_hash, block)
                else:  # the usual case: it was the only holder
                    del cached[old_hash]
                block_hash[block] = fill
            elif fill is not None:
                block_hash[block] = fill
            ref_cnt[block] = 1
        return owner, run

    def _drop_owner(self, req: Request, forget: bool) -> list[int] | None:
        """Forget that `req` holds blocks (and, with `forget`, its memoised hashes); its blocks."""
        blocks = self.req_blocks.pop(req, None)
        self.num_hashed_blocks.pop(req, None)
        req.kv_register_at = req.kv_grow_at = 0
        if forget:
            self.req_hashes.pop(req, None)
        return blocks

    def free(self, req: Request, forget: bool = False) -> None:
        """Release the request's blocks, tail blocks first in the eviction order (uncached ones to the
        front of the free queue under `free_uncached_first`).

        `forget` also drops its memoised hashes (when the request is gone for good).
        """
        if req.kv_key is not None:
            self.lazy.release(req, forget)
            if req.kv_lazy:  # (still private)
                marked = self.num_hashed_blocks.get(req, 0)
                blocks = self._drop_owner(req, forget)
                if blocks:
                    self._release_private(blocks, marked)
                return
        blocks = self._drop_owner(req, forget)
        if not blocks:
            return
        order = blocks[::-1]  # tail blocks first
        if len(order) > 1 and itemgetter(*order)(self.ref_cnt).count(1) == len(order):
            first, back = self._release_sole(order, req)  # (no other holder: the usual case)
        else:
            first, back = self._release_shared(order)
        self.free_queue.push_back(back)
        if first:
            self.free_queue.push_front(first)

    def _release_private(self, blocks: list[int], marked: int) -> None:
        """`free` for a private request's `blocks`, its first `marked` ones marked: it holds each alone
        (no other request can hit them) and the rest hold nothing (sim.core.kv_lazy), so the blocks'
        counts and hashes need not be read to sort them (as `_release_sole` does)."""
        ref_cnt = self.ref_cnt
        for block in blocks:
            ref_cnt[block] = 0
        order = blocks[::-1]  # tail blocks first: the unmarked ones, then the marked
        unmarked = len(blocks) - marked
        if self.free_uncached_first and unmarked:
            self.free_queue.push_back(order[unmarked:])
            self.free_queue.push_front(order[:unmarked])
        else:
            self.free_queue.push_back(order)

    def _release_shared(self, order: list[int]) -> tuple[list[int], list[int]]:
        """Drop one holder of each block of `order`; the blocks freed, (to the front, to the back)."""
        first, back = [], []
        ref_cnt, block_hash = self.ref_cnt, self.block_hash
        uncached_first = self.free_uncached_first
        for block in order:
            count = ref_cnt[block] - 1
            ref_cnt[block] = count
            if count == 0:
                if uncached_first and block_hash[block] is None:
                    first.append(block)
                else:
                    back.append(block)
        return first, back

    def _release_sole(self, order: list[int], req: Request) -> tuple[list[int], list[int]]:
        """`_release_shared` where every block's count is 1 (a count covers each place a block is
        held, so `req` holds each once and alone): all are freed, and their hashes are sorted
        in C (a private request's blocks are marked, `req` their owner, but for its last, part-filled
        one)."""
        ref_cnt = self.ref_cnt
        for block in order:
            ref_cnt[block] = 0
        if not self.free_uncached_first:
            return [], order
        hashes = itemgetter(*order)(self.block_hash)
        if hashes[-1] is req:  # a private request's blocks: marked but for a part-filled last one. Counted
            # by identity; `count(None)` compares None with each owner instead
            lazy = hashes.count(req)
            if lazy == len(order):
                return [], order
            if lazy == len(order) - 1 and hashes[0] is None:
                return order[:1], order[1:]
        uncached = hashes.count(None)
        if not uncached:
            return [], order
        if uncached == 1 and hashes[0] is None:  # only the last block holds no cached prefix
            return order[:1], order[1:]
        if uncached == len(order):
            return order, []
        return ([block for block, h in zip(order, hashes) if h is None],
                [block for block, h in zip(order, hashes) if h is not None])
