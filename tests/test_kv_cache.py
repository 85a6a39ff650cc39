"""Paged KV cache and prefix caching (issue 3)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.core.kv_cache import KVCacheManager
from sim.core.invariants import InvariantError, _check_kv
from sim.core.kv_stack import StackedKVCacheManager
from sim.core.request import Request
from sim.core.sampling_params import SamplingParams


def _req(tokens, name="r") -> Request:
    return Request(name, np.asarray(tokens, dtype=np.int32), SamplingParams(), eos_token_id=2)


def _compute(kv: KVCacheManager, req: Request, n: int, hits=(), num_hit_tokens: int = 0) -> None:
    assert kv.allocate(req, n, list(hits)) is not None
    req.num_computed_tokens = num_hit_tokens + req.num_computed_tokens + n
    kv.cache_full_blocks(req)


def test_blocks_follow_computed_tokens():
    kv = KVCacheManager(10, 4, enable_prefix_caching=False)
    req = _req(range(10))
    _compute(kv, req, 5)
    assert len(kv.blocks_of(req)) == 2
    _compute(kv, req, 3)
    assert len(kv.blocks_of(req)) == 2
    _compute(kv, req, 1)
    assert len(kv.blocks_of(req)) == 3
    kv.free(req)
    assert kv.num_free_blocks == kv.num_usable_blocks == 9  # block 0 is vLLM's null block


@pytest.mark.parametrize("make", [lambda: KVCacheManager(10, 4, enable_prefix_caching=True),
                                  lambda: StackedKVCacheManager(10, 4)])
def test_dropping_a_requests_blocks_drops_its_growth_bounds(make):
    """A decode pass skips the block checks below `kv_grow_at` (and registration below
    `kv_register_at`): bounds that held for the blocks freed must not outlive them."""
    kv = make()
    req = _req(range(10))
    _compute(kv, req, 6)
    req.kv_grow_at = 9
    kv.free(req)
    assert req.kv_grow_at == 0 and req.kv_register_at == 0


def test_allocation_that_does_not_fit_changes_nothing():
    kv = KVCacheManager(4, 4, enable_prefix_caching=False)  # 3 usable: block 0 is the null block
    a = _req(range(8), "a")
    _compute(kv, a, 8)
    b = _req(range(8), "b")
    assert kv.allocate(b, 8) is None
    assert kv.num_free_blocks == 1 and b not in kv.req_blocks


def test_prefix_hit_reuses_full_blocks_and_leaves_one_token():
    kv = KVCacheManager(16, 4, enable_prefix_caching=True)
    a = _req(range(100, 112), "a")
    _compute(kv, a, 12)
    kv.free(a)
    b = _req(range(100, 112), "b")           # identical prompt: at most num_tokens - 1 may hit
    hits, num_hit = kv.lookup_prefix(b)
    assert num_hit == 8 and len(hits) == 2
    c = _req(list(range(100, 108)) + [7, 7, 7, 7], "c")   # shares two blocks, then differs
    assert kv.lookup_prefix(c)[1] == 8
    d = _req([9] + list(range(101, 112)), "d")            # differs in the first token: chain breaks
    assert kv.lookup_prefix(d)[1] == 0


def test_cached_blocks_are_evicted_least_recently_freed_first():
    kv = KVCacheManager(5, 4, enable_prefix_caching=True)  # 4 usable
    a, b = _req(range(0, 5), "a"), _req(range(50, 55), "b")
    _compute(kv, a, 4)
    _compute(kv, b, 4)
    kv.free(a)
    kv.free(b)
    c = _req(range(90, 99), "c")
    _compute(kv, c, 8)                 # needs 2 blocks: takes the 2 never-cached, then...
    d = _req(range(200, 205), "d")
    _compute(kv, d, 4)                 # ...evicts a's block (freed first), keeps b's
    assert kv.lookup_prefix(_req(range(0, 5)))[1] == 0
    assert kv.lookup_prefix(_req(range(50, 55)))[1] == 4


def test_shared_prefix_blocks_are_shared_not_copied():
    kv = KVCacheManager(8, 4, enable_prefix_caching=True)
    a = _req(range(10, 19), "a")
    _compute(kv, a, 9)
    b = _req(list(range(10, 18)) + [1, 2, 3], "b")
    hits, num_hit = kv.lookup_prefix(b)
    _compute(kv, b, b.num_tokens - num_hit, hits, num_hit)
    assert kv.blocks_of(a)[:2] == kv.blocks_of(b)[:2]
    assert all(kv.ref_cnt[blk] == 2 for blk in kv.blocks_of(b)[:2])
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == kv.num_usable_blocks


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40)), min_size=1, max_size=30))
def test_blocks_conserved_under_random_allocate_and_free(ops):
    kv = KVCacheManager(20, 4, enable_prefix_caching=True)
    live: dict[int, Request] = {}
    for name, n in ops:
        req = live.get(name)
        if req is None or req.num_computed_tokens + n > req.num_tokens:
            if req is not None:
                kv.free(req)
            live[name] = req = _req(np.arange(60) % 7 + name, f"r{name}")
        hits, num_hit = kv.lookup_prefix(req) if req.num_computed_tokens == 0 else ([], 0)
        n = min(n, req.num_tokens - req.num_computed_tokens - num_hit)
        if n > 0 and kv.allocate(req, n, hits) is not None:
            req.num_computed_tokens += num_hit + n
            kv.cache_full_blocks(req)
        owned = {b for blocks in kv.req_blocks.values() for b in blocks}
        assert len(owned) + kv.num_free_blocks == kv.num_usable_blocks and 0 not in owned
    for req in live.values():
        kv.free(req)
    assert kv.num_free_blocks == kv.num_usable_blocks


@pytest.mark.parametrize("caching", [False, True])
def test_free_is_idempotent(caching):
    kv = KVCacheManager(4, 4, enable_prefix_caching=caching)
    req = _req(range(6))
    _compute(kv, req, 6)
    kv.free(req)
    kv.free(req)
    assert kv.num_free_blocks == kv.num_usable_blocks == 3


def _check_prefix_index(kv: KVCacheManager) -> None:
    """Every block holding a hash is that hash's first holder or one of its further holders."""
    holders: dict = {}
    for block, h in enumerate(kv.block_hash):
        if h is not None:
            holders.setdefault(h, set()).add(block)
    assert set(kv.cached) == set(holders)
    for h, blocks in holders.items():
        more = kv.more_holders.get(h, {})
        assert kv.cached[h] not in more and {kv.cached[h], *more} == blocks


def test_a_hash_held_twice_hits_its_first_holder_until_evicted():
    kv = KVCacheManager(5, 4, enable_prefix_caching=True)  # 4 usable blocks
    a, b = _req(range(100, 105), "a"), _req(range(100, 105), "b")
    _compute(kv, a, 5)
    _compute(kv, b, 5)                 # no lookup: b's first block holds the same hash as a's
    first_a, first_b = kv.blocks_of(a)[0], kv.blocks_of(b)[0]
    kv.free(a)
    kv.free(b)                         # queue: b's tail, a's tail, a's first, b's first
    probe = _req(range(100, 105), "p")
    assert kv.lookup_prefix(probe)[0] == [first_a] and len(kv.cached) == 1
    _compute(kv, _req(range(12), "x"), 12)  # takes three blocks, a's first among them
    _check_prefix_index(kv)
    assert kv.lookup_prefix(probe)[0] == [first_b] and kv.more_holders == {}


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40), st.booleans()), min_size=1, max_size=30))
def test_prefix_index_matches_block_hashes(ops):
    """Identical prompts admitted without a lookup share hashes: the index stays exact."""
    kv = KVCacheManager(20, 4, enable_prefix_caching=True)
    live: dict[int, Request] = {}
    for name, n, lookup in ops:
        req = live.get(name)
        if req is None or req.num_computed_tokens + n > req.num_tokens:
            if req is not None:
                kv.free(req)
            live[name] = req = _req(np.arange(40) % 5, f"r{name}")
        hits, num_hit = kv.lookup_prefix(req) if lookup and req.num_computed_tokens == 0 else ([], 0)
        n = min(n, req.num_tokens - req.num_computed_tokens - num_hit)
        if n > 0 and kv.allocate(req, n, hits) is not None:
            req.num_computed_tokens += num_hit + n
            kv.cache_full_blocks(req)
        _check_prefix_index(kv)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=9), st.lists(st.integers(0, 6), max_size=30),
       st.integers(1, 4))
def test_blocks_filled_by_decode_rows_hash_as_prompt_blocks(prompt, outputs, block_size):
    """A block filled one output token at a time (the one-block path) gets the hash a prompt with the
    same tokens gives it: a later request with the whole sequence as its prompt hits every full block."""
    kv = KVCacheManager(40, block_size, enable_prefix_caching=True)
    req = _req(prompt, "a")
    _compute(kv, req, len(prompt))
    for token in outputs:
        req.output_token_ids.append(token)
        _compute(kv, req, 1)
        _check_prefix_index(kv)
    whole = _req(prompt + outputs + [0], "b")
    assert kv.lookup_prefix(whole)[0] == kv.blocks_of(req)[:(len(prompt) + len(outputs)) // block_size]
    own = kv.req_hashes.get(req, [])
    assert own == kv.req_hashes[whole][:len(own)]


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 30), st.booleans()), min_size=1, max_size=40),
       st.integers(1, 4))
def test_stacked_free_queue_hands_out_the_plain_managers_blocks(ops, block_size):
    """Without prefix caching, the stack (sim.core.kv_stack) gives the blocks the plain free queue gives,
    in the same order, and leaves the same free queue, through admissions, growth, preemptions, frees."""
    plain = KVCacheManager(24, block_size, enable_prefix_caching=False)
    stacked = StackedKVCacheManager(24, block_size)
    live: dict[int, tuple[Request, Request]] = {}
    for name, n, finish in ops:
        pair = live.get(name)
        if pair is None or finish:
            for kv, req in zip((plain, stacked), pair or ()):
                kv.free(req, forget=True)
            live[name] = pair = (_req(range(60), f"p{name}"), _req(range(60), f"s{name}"))
        got = []
        for kv, req in zip((plain, stacked), pair):
            n_now = min(n, req.num_tokens - req.num_computed_tokens)
            got.append(kv.allocate(req, n_now) if n_now > 0 else [])
            if got[-1] is not None:
                req.num_computed_tokens += n_now
            grown = kv.take_next_block(kv.req_blocks.setdefault(req, []), (len(kv.req_blocks[req]) + 1) * block_size)
            got.append((grown, list(kv.req_blocks[req])))
        assert got[:2] == got[2:]
        assert list(plain.free_queue) == list(stacked.free_queue) and plain.ref_cnt == stacked.ref_cnt


@pytest.mark.parametrize("corrupt", [None, "free twice", "owned and free"])
def test_invariants_read_the_stacked_free_queue(corrupt):
    """`check_invariants`' KV checks work on the stack (a list, not a dict) and see a block in it twice."""
    kv = StackedKVCacheManager(8, 4)
    req = _req(range(6))
    _compute(kv, req, 6)
    stack = kv.free_queue.blocks
    if corrupt == "free twice":
        stack[0] = stack[1]  # the counts still add up: only the duplicate check sees it
    elif corrupt == "owned and free":
        stack[0] = kv.blocks_of(req)[0]
    if corrupt is None:
        _check_kv(kv)
    else:
        with pytest.raises(InvariantError):
            _check_kv(kv)


@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=50), st.lists(st.integers(0, 2**31 - 1), max_size=20),
       st.integers(1, 5), st.lists(st.integers(0, 20), min_size=1, max_size=4))
def test_block_hashes_chain_each_blocks_int32_bytes(prompt, output, block_size, asks):
    """`_hashes` gives hash((parent hash, the block's tokens as int32 bytes)) chained from 0, whatever
    blocks are asked for in whatever order (the memo only grows), a partial last block included."""
    kv = KVCacheManager(8, block_size, enable_prefix_caching=True)
    req = _req(prompt)
    req.output_token_ids.extend(output)
    data = np.asarray(prompt + output, dtype=np.int32).tobytes()
    step = 4 * block_size
    expected, parent = [], 0
    for start in range(0, len(data), step):
        parent = hash((parent, data[start:start + step]))
        expected.append(parent)
    for num_blocks in asks:
        got = kv._hashes(req, min(num_blocks, len(expected)))
        assert got == expected[:len(got)] and len(got) >= min(num_blocks, len(expected))
