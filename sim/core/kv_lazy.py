"""Deferred prefix-cache registration for requests whose blocks no other request can hit.

A block's prefix hash chains from the request's first block, so a lookup reaches a request's cached
blocks only if its own first block holds the same tokens. A request whose first block no other request
in the engine shares (no other live request, and no resident block from an earlier one) is *private*:
the prefix cache's answer to every lookup is the same whether its blocks are hashed or not. Hashing
them cost a fifth to a quarter of the issue-15 runs' time (docs/performance.md), so a private
request's blocks are only marked as they fill (a marked, "LAZY" block's `block_hash` entry is the
request itself, its *owner*, where a registered block's is its hash: one table tells both); they count
as cached (the steps' cached-block column), sit in the free queue as cached blocks do, and leave the
count when evicted. They are hashed and registered, exactly as they would have been ("materialised"),
the moment the request stops being private: when a request with the same first block arrives, also after
it finished while some of its blocks are still resident.

A preempted private request stays private where no request with its first block was ever hashed
(`hashed_keys`): then no resident block outside its own holds a hash of its chain, and its readmission's
lookup would hit exactly the leading run of its former blocks still marked (`own_hits`), with no hashing.
Where a marked block of it lies past that run (an earlier one evicted, or past the lookup's last block),
its place would be marked twice once recomputed, where eager registration keeps one hash: it is
materialised then, and looked up as before. (A preempted request with a hashed first block is
materialised at its preemption.)

Only the plain `KVCacheManager` defers (`KVCacheManager.enable_private_prefixes`); every request that
enters its engine must go through `arrive`, so that no chain appears unseen.
"""
from __future__ import annotations

import numpy as np

ENABLED = True
"""Whether engines defer private requests' registration (tests turn it off to compare)."""


def first_block_key(req, stream, block_size: int) -> bytes:
    """The int32 bytes of the request's first block: its first `block_size` tokens, prompt then the
    output stream (`stream`: position -> token id) where the prompt is shorter."""
    prompt = req.prompt_token_ids
    if req.num_prompt_tokens >= block_size:
        return prompt[:block_size].tobytes()
    outputs = [stream(p) for p in range(block_size - req.num_prompt_tokens)]
    return prompt.tobytes() + np.asarray(outputs, dtype=np.int32).tobytes()


class PrivatePrefixes:
    """The requests of a `KVCacheManager`, by first block, and the private ones' unhashed blocks."""

    def __init__(self, kv):
        self.kv = kv
        #: first-block bytes -> the live requests with that first block, and finished private ones
        #: with blocks still resident
        self.holders: dict[bytes, list] = {}
        #: first blocks of every request whose blocks were hashed (not private at arrival, or materialised)
        self.hashed_keys: set[bytes] = set()

    def arrive(self, req, key: bytes, private_ok: bool = True) -> None:
        """Track `req` (entering the engine) by its first block `key`; it is private unless another
        holder shares the key (which then stops being private) or a resident cached block starts the
        same chain."""
        req.kv_key = key
        holders = self.holders.get(key)
        if holders:  # (materialising a finished holder may drop it, and the key's list with it)
            for other in list(holders):
                if other.kv_lazy:
                    self.materialize(other)
            self.holders.setdefault(key, []).append(req)
            self.hashed_keys.add(key)
            return
        self.holders[key] = [req]
        req.kv_lazy = private_ok and hash((0, key)) not in self.kv.cached
        if not req.kv_lazy:
            self.hashed_keys.add(key)

    def mark(self, req, done: int, num_full: int) -> None:
        """`cache_full_blocks` for a private request: blocks `done`..`num_full` marked (their
        `block_hash` entry is `req`), not hashed."""
        kv = self.kv
        block_hash = kv.block_hash
        blocks = kv.req_blocks[req][done:num_full]
        for block in blocks:  # (each holds nothing: a private request hits no prefix, so its blocks are
            block_hash[block] = req  # its own fresh ones, and those past `done` unmarked)
        kv.lazy_blocks += len(blocks)
        req.kv_lazy_resident += len(blocks)
        kv.num_hashed_blocks[req] = num_full
        req.kv_register_at = (num_full + 1) * kv.block_size

    def marked(self, req, num_full: int) -> None:
        """`mark`'s counts for a private request's first `num_full` blocks, marked as they left the free
        queue (`KVCacheManager._allocate_private`)."""
        kv = self.kv
        kv.lazy_blocks += num_full
        req.kv_lazy_resident += num_full
        kv.num_hashed_blocks[req] = num_full
        req.kv_register_at = (num_full + 1) * kv.block_size

    def lose(self, req, count: int) -> None:
        """`count` of `req`'s marked blocks left the free queue (`KVCacheManager._pop_free_many` evicts a
        request's blocks together, run by run): it leaves once none is resident and it is finished."""
        self.kv.lazy_blocks -= count
        req.kv_lazy_resident -= count
        if not req.kv_lazy_resident and req.kv_lazy_blocks is not None:
            self.leave(req)

    def release(self, req, forget: bool) -> None:
        """`req`'s blocks are being freed: preempted (`forget` False), a private one keeps its marked
        blocks for its readmission's lookup (`own_hits`), or is materialised where a request with its
        first block was ever hashed; finished, it leaves, or stays while it has marked blocks resident (a
        later request with its first block must find them)."""
        if not forget:
            if req.kv_lazy:
                if req.kv_key in self.hashed_keys:
                    self.materialize(req)
                else:
                    req.kv_lazy_held = self._marked_blocks(req)
            return
        if req.kv_lazy_blocks is not None:
            return  # released already (a hook deferred its completion)
        if req.kv_lazy and req.kv_lazy_resident:
            req.kv_lazy_blocks = self._marked_blocks(req)
        else:
            self.leave(req)
        req.kv_lazy_held = None

    def _marked_blocks(self, req) -> list:
        """The blocks `req` marked, as far as they were not evicted since (each is checked against
        `block_hash`): finished, preempted and waiting, or running."""
        if req.kv_lazy_blocks is not None:
            return req.kv_lazy_blocks
        kv = self.kv
        blocks = kv.req_blocks.get(req)
        if blocks is None:  # waiting: preempted (or never admitted)
            return req.kv_lazy_held or []
        return blocks[:kv.num_hashed_blocks.get(req, 0)]

    def own_hits(self, req) -> list[int] | None:
        """`lookup_prefix`'s hits for a private request preempted with marked blocks: the leading run
        of them still marked (the blocks eager registration's chain would hit), or None where the
        lookup must hash: a marked block lies past that run (it is materialised now), or a hit's last
        block is dropped (`drop_last_hit_block`: that block would be marked twice)."""
        kv = self.kv
        if kv.drop_last_hit_block:
            self.materialize(req)
            return None
        block_hash, hits = kv.block_hash, []
        for block in req.kv_lazy_held[:(req.num_tokens - 1) // kv.block_size]:
            if block_hash[block] is not req:
                break
            hits.append(block)
        if len(hits) < req.kv_lazy_resident:
            self.materialize(req)
            return None
        return hits

    def rejoin(self, req, num_hits: int) -> None:
        """A preempted private request is admitted with its first `num_hits` blocks its own marked ones
        (`own_hits`): they count as registered."""
        self.kv.num_hashed_blocks[req] = num_hits
        req.kv_lazy_held = None

    def materialize(self, req) -> None:
        """Hash and register `req`'s resident marked blocks as `cache_full_blocks` would have; it is no
        longer private."""
        kv = self.kv
        finished = req.kv_lazy_blocks is not None
        blocks = self._marked_blocks(req)
        self.hashed_keys.add(req.kv_key)
        if req.kv_lazy_resident:
            block_hash, claim = kv.block_hash, kv.cached.setdefault
            for block, h in zip(blocks, kv._hashes(req, len(blocks))):
                if block_hash[block] is req:  # (a block evicted since may be another's now)
                    block_hash[block] = h
                    kv.lazy_blocks -= 1
                    if claim(h, block) != block:
                        kv.more_holders.setdefault(h, {})[block] = None
        req.kv_lazy = False
        req.kv_lazy_resident = 0
        req.kv_lazy_held = None
        if finished:
            kv.req_hashes.pop(req, None)
            self.leave(req)

    def leave(self, req) -> None:
        """Stop tracking `req` (finished, nothing of it resident)."""
        holders = self.holders[req.kv_key]
        holders.remove(req)
        if not holders:
            del self.holders[req.kv_key]
        req.kv_key = req.kv_lazy_blocks = None
        req.kv_lazy = False
