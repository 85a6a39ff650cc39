"""The prefix cache side of the KV manager: chained block hashes, lookups and registrations.

`PrefixCache` is mixed into `KVCacheManager` (sim.core.kv_cache), which owns the blocks (`block_hash`,
`cached`, `more_holders`, `req_blocks`, `req_hashes`, `num_hashed_blocks`) it reads and writes.
"""
from __future__ import annotations

from array import array
from itertools import islice

from sim.core.request import Request


def _int32_bytes(tokens: list[int]) -> bytes:
    """The tokens as native int32 bytes (what `np.asarray(tokens, np.int32).tobytes()` gives)."""
    return array(INT32, tokens).tobytes()


INT32 = next(code for code in "ilh" if array(code).itemsize == 4)


class PrefixCache:
    """Prefix hashing, lookup and registration (a mixin of `KVCacheManager`)."""

    def lookup_prefix(self, req: Request) -> tuple[list[int], int]:
        """Cached blocks matching the request's prefix, and the tokens they cover.

        At most `num_tokens - 1` tokens hit, so the last token is computed and yields logits.
        """
        if not self.enable_prefix_caching:
            return [], 0
        if req.kv_lazy:  # a private request: no chain of its first block is resident but its own
            if req.kv_lazy_held is None:
                return [], 0
            hits = self.lazy.own_hits(req)  # (preempted: its marked blocks; None: materialised now)
            if hits is not None:
                return hits, len(hits) * self.block_size
        max_blocks = (req.num_tokens - 1) // self.block_size
        hashes = self.req_hashes.get(req)
        if hashes is None or len(hashes) < max_blocks:
            hashes = self._hashes(req, max_blocks)
        cached = self.cached
        if not max_blocks or hashes[0] not in cached:
            return [], 0  # no hit (the usual case without shared prefixes)
        hits = []
        for block in map(cached.get, islice(hashes, max_blocks)):
            if block is None:
                break
            hits.append(block)
        if self.drop_last_hit_block and hits:
            hits.pop()  # (its last position's hidden state feeds the EAGLE head: recomputed)
        return hits, len(hits) * self.block_size

    def _hashes(self, req: Request, num_blocks: int) -> list[int]:
        """Chained hashes of the request's first `num_blocks` full blocks (memoised)."""
        hashes = self.req_hashes.get(req)
        if hashes is None:
            hashes = self.req_hashes[req] = []
        elif len(hashes) >= num_blocks:
            return hashes
        bs = self.block_size
        parent = hashes[-1] if hashes else 0
        num_prompt = req.num_prompt_tokens
        first, end = len(hashes) * bs, num_blocks * bs  # only the blocks not hashed yet
        if first >= num_prompt and end - first == bs:  # one block of output tokens (a decode row's)
            tail = req.output_token_ids[first - num_prompt:end - num_prompt]
            if len(tail) == bs:
                hashes.append(hash((parent, self._pack_block(*tail))))
                return hashes
        data = req.prompt_token_ids[first:min(end, num_prompt)].tobytes() if first < num_prompt else b""
        if end > num_prompt:
            tail = req.output_token_ids[max(0, first - num_prompt):end - num_prompt]
            data += _int32_bytes(tail)
        append = hashes.append
        whole = len(data) - len(data) % (4 * bs)  # int32 token ids: every block is the same bytes
        for chunk, in self._split_blocks(data if whole == len(data) else data[:whole]):
            parent = hash((parent, chunk))
            append(parent)
        if whole < len(data):  # a partial last block
            append(hash((parent, data[whole:])))
        return hashes

    def hash_next_tokens(self, num_tokens: int) -> None:
        """Key each block's prefix-cache entry with the `num_tokens` tokens after it too, so a block is
        hit, and registered, only once those are known (vLLM 0.33 with EAGLE-style drafts). Binds the
        paths that honour it on this instance (a manager without it pays nothing); call it before any
        request arrives (private prefixes, which hash later, are turned off)."""
        self.hash_lookahead = num_tokens
        self.lazy = None
        self._hashes = self._hashes_ahead
        self.cache_full_blocks = self._cache_full_blocks_ahead

    def _hashes_ahead(self, req: Request, num_blocks: int) -> list[int]:
        """`_hashes` under `hash_next_tokens`: each block's chained hash covers the tokens after it; only
        blocks whose following tokens are known get one."""
        hashes = self.req_hashes.setdefault(req, [])
        bs, ahead = self.block_size, self.hash_lookahead
        num_blocks = min(num_blocks, (req.num_tokens - ahead) // bs)
        num_prompt = req.num_prompt_tokens
        while len(hashes) < num_blocks:
            start, end = len(hashes) * bs, (len(hashes) + 1) * bs + ahead
            head = req.prompt_token_ids[start:min(end, num_prompt)].tolist() if start < num_prompt else []
            tail = req.output_token_ids[max(0, start - num_prompt):max(0, end - num_prompt)]
            hashes.append(hash((hashes[-1] if hashes else 0, tuple(head), tuple(tail))))
        return hashes

    def _cache_full_blocks_ahead(self, req: Request, num_tokens: int | None = None) -> None:
        """`cache_full_blocks` under `hash_next_tokens`: a full block waits for the tokens after it."""
        if not self.enable_prefix_caching:
            return
        known = req.num_computed_tokens if num_tokens is None else num_tokens
        num_full = min(known, req.num_tokens - self.hash_lookahead) // self.block_size
        done = self.num_hashed_blocks.get(req, 0)
        if num_full > done:
            self._cache_blocks(req, done, num_full)

    def _register(self, block_hash, block: int) -> None:
        """Record that `block` holds `block_hash` (a prefix hit keeps taking the first holder)."""
        if block_hash in self.cached:
            self.more_holders.setdefault(block_hash, {})[block] = None
        else:
            self.cached[block_hash] = block

    def _evict(self, block_hash, block: int) -> None:
        """`block` no longer holds `block_hash`: the next holder, if any, takes its place."""
        more = self.more_holders.get(block_hash)
        if more is None:
            del self.cached[block_hash]
            return
        if self.cached[block_hash] == block:
            block = next(iter(more))
            self.cached[block_hash] = block
        del more[block]
        if not more:
            del self.more_holders[block_hash]

    def cache_full_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        """Register the request's blocks full within its first `num_tokens` tokens (default: its
        computed tokens) in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = (req.num_computed_tokens if num_tokens is None else num_tokens) // bs
        done = self.num_hashed_blocks.get(req, 0)
        if req.kv_lazy:  # a private request's blocks are marked, not hashed (sim.core.kv_lazy)
            if num_full == done + 1:  # (`PrivatePrefixes.mark` of one block, inline: a decode row's)
                self.block_hash[self.req_blocks[req][done]] = req  # (marked: its owner in place of a hash)
                self.lazy_blocks += 1
                req.kv_lazy_resident += 1
                self.num_hashed_blocks[req] = num_full
                req.kv_register_at = (num_full + 1) * bs
            elif num_full > done:
                self.lazy.mark(req, done, num_full)
            return
        if num_full != done + 1:
            if num_full > done:
                self._cache_blocks(req, done, num_full)
            return
        # one block filled (a decode row's, the hot path): its hash from the memo or, for a block of
        # output tokens only, hashed here as `_hashes` would
        hashes = self.req_hashes.get(req)
        if hashes is None:
            return self._cache_blocks(req, done, num_full)
        if len(hashes) > done:
            h = hashes[done]
        else:
            first = done * bs - req.num_prompt_tokens  # >= 0: the block holds output tokens only
            tail = req.output_token_ids[first:first + bs] if first >= 0 and len(hashes) == done else ()
            if len(tail) < bs:
                return self._cache_blocks(req, done, num_full)
            h = hash((hashes[-1] if hashes else 0, self._pack_block(*tail)))
            hashes.append(h)
        block = self.req_blocks[req][done]
        if self.block_hash[block] is None:
            self.block_hash[block] = h
            if h in self.cached:  # another block holds it already (the first holder stays first)
                self._register(h, block)
            else:
                self.cached[h] = block
        self.num_hashed_blocks[req] = num_full
        req.kv_register_at = (num_full + 1) * bs

    def _cache_blocks(self, req: Request, done: int, num_full: int) -> None:
        """`cache_full_blocks` for blocks `done` to `num_full` (exclusive) of the request."""
        hashes = self._hashes(req, num_full)
        blocks = self.req_blocks[req]
        block_hash, claim = self.block_hash, self.cached.setdefault
        for block, h in zip(islice(blocks, done, num_full), islice(hashes, done, num_full)):
            if block_hash[block] is None:
                block_hash[block] = h
                if claim(h, block) != block:  # another block holds it already (it stays first)
                    self.more_holders.setdefault(h, {})[block] = None
        self.num_hashed_blocks[req] = num_full
        req.kv_register_at = (num_full + 1) * self.block_size
