"""Deferred registration of private requests' blocks (sim.core.kv_lazy): the records are the ones eager
registration gives, bit for bit, and the cache holds the same hashes whenever a lookup could see them."""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.core import kv_lazy
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.kv_cache import KVCacheManager
from sim.core.kv_lazy import first_block_key
from sim.core.request import Request
from sim.core.sampling_params import SamplingParams
from sim.core.speculative import SpeculativeConfig
from sim.engine.simulation import run_engine
from sim.engine.spec_decode import SpecDecoder
from workloads import poisson_workload
from tests.engine_harness import padded_budget
from tests.test_fast_mode import assert_identical, configs, long_runs
from tests.test_spec_decode_properties import TOKEN_TEXT, acceptance_scripts, spec_requests
from tests.test_spec_decode_properties import configs as spec_configs


def run(specs, config, deferred: bool, monkeypatch):
    monkeypatch.setattr(kv_lazy, "ENABLED", deferred)
    return run_engine(specs, config, LinearCostModel())


@given(long_runs(), configs())
def test_deferred_registration_gives_the_eager_records(specs, config):
    """Shared prefixes (16 or 40 tokens), short prompts, preemptions, aborts, both engine modes."""
    with pytest.MonkeyPatch.context() as mp:
        for mode in ("step", "fast"):
            cfg = replace(config, mode=mode)
            assert_identical(run(specs, cfg, False, mp), run(specs, cfg, True, mp))


def test_deferred_registration_gives_the_eager_records_under_preemption(monkeypatch):
    config = EngineConfig(num_gpu_blocks=1_500, max_model_len=16384, max_num_batched_tokens=8192)
    workload = poisson_workload(rate=30.0, num_requests=150, lengths="sharegpt")
    eager, deferred = run(workload, config, False, monkeypatch), run(workload, config, True, monkeypatch)
    assert_identical(eager, deferred)
    assert sum(eager.requests.num_preemptions) > 0


def request(tokens, index=0) -> Request:
    return Request(f"r{index}", np.asarray(tokens, dtype=np.int32), SamplingParams(max_tokens=100), 2, index=index)


def manager(deferred: bool) -> KVCacheManager:
    kv = KVCacheManager(64, 4, True)
    if deferred:
        assert kv.enable_private_prefixes()
    return kv


def admit(kv, req, computed):
    if kv.lazy is not None:
        kv.lazy.arrive(req, first_block_key(req, None, kv.block_size))
    hits, cached = kv.lookup_prefix(req)
    kv.allocate(req, computed - cached, hits)
    req.num_computed_tokens = computed
    return cached


def test_a_private_request_marks_its_blocks_and_counts_them_as_cached():
    eager, lazy = manager(False), manager(True)
    for kv in (eager, lazy):
        admit(kv, request(range(10, 22)), 12)
    assert lazy.cached == {} and lazy.lazy_blocks == 3
    req = next(iter(lazy.req_blocks))
    assert [lazy.block_hash[b] for b in lazy.req_blocks[req]] == [req] * 3  # (marked: the owner)
    assert lazy.num_cached_hashes == eager.num_cached_hashes == 3


def test_a_request_sharing_the_first_block_finds_the_blocks_eager_registration_left():
    """The first request finishes; its blocks sit in the free queue, one evicted; a second with the
    same first two blocks arrives: the cache is eager's, and it hits the same blocks."""
    states = []
    for deferred in (False, True):
        kv = manager(deferred)
        first = request(range(10, 22))
        admit(kv, first, 12)
        kv.free(first, forget=True)
        kv._pop_free_many(61)           # every never-used block, then the first's tail block
        second = request([*range(10, 18), 99, 98, 97, 96, 95], index=1)
        states.append((admit(kv, second, 13), dict(kv.cached), kv.num_cached_hashes))
    assert states[0] == states[1] and states[0][0] == 8


def test_a_preempted_private_request_hits_its_own_marked_blocks_unhashed():
    results = []
    for deferred in (False, True):
        kv = manager(deferred)
        req = request(range(30, 43))
        admit(kv, req, 13)
        kv.free(req)                    # preempted: its blocks stay cached in the free queue
        req.num_computed_tokens = 0
        assert req.kv_lazy == deferred and not (deferred and kv.req_hashes)  # (still private: nothing hashed)
        hits = kv.lookup_prefix(req)
        kv.allocate(req, 1, hits[0])
        results.append((hits, kv.num_cached_hashes, kv.blocks_of(req), list(kv.free_queue)))
    assert results[0] == results[1] and len(results[0][0][0]) == 3


def test_a_preempted_request_whose_first_block_was_hashed_before_is_materialised():
    """Two requests with one first block (hashed), gone and their blocks evicted; a third with it arrives
    private, but its chain's hashes may be resident still (not here): preempted, it is materialised."""
    kv = manager(True)
    pair = [request(range(30, 43), index=i) for i in range(2)]
    for req in pair:
        admit(kv, req, 13)
    assert not pair[0].kv_lazy
    for req in pair:
        kv.free(req, forget=True)
    kv._pop_free_many(len(kv.free_queue))  # (every block evicted; held by nothing from here on)
    for block in range(1, kv.num_gpu_blocks):
        kv.ref_cnt[block] = 0
    kv.free_queue.push_back(list(range(1, kv.num_gpu_blocks)))
    third = request(range(30, 45), index=2)
    admit(kv, third, 15)
    assert third.kv_lazy
    kv.free(third)
    assert not third.kv_lazy and third.kv_lazy_held is None
    private = request(range(60, 73), index=3)
    admit(kv, private, 13)
    kv.free(private)
    assert private.kv_lazy and private.kv_lazy_held is not None


def test_a_preempted_private_request_with_a_marked_block_past_its_hits_is_materialised():
    """Three full blocks marked; a lookup hits at most two (its last token is computed): the third,
    recomputed, would be marked twice where eager registration holds its hash once."""
    results = []
    for deferred in (False, True):
        kv = manager(deferred)
        req = request(range(30, 42))
        admit(kv, req, 12)
        kv.free(req)
        req.num_computed_tokens = 0
        hits = kv.lookup_prefix(req)
        assert not req.kv_lazy
        kv.allocate(req, 4, hits[0])
        results.append((hits, kv.num_cached_hashes, kv.blocks_of(req), list(kv.free_queue)))
    assert results[0] == results[1] and len(results[0][0][0]) == 2


@given(spec_requests(), spec_configs, acceptance_scripts(), st.integers(1, 5),
       st.sampled_from(["eagle3", "ngram"]))
def test_deferred_registration_gives_the_eager_records_with_speculative_decoding(specs, config, acceptance,
                                                                                k, method):
    """Drafts, rejected slots and lookahead blocks register through the same calls."""
    records = []
    with pytest.MonkeyPatch.context() as mp:
        for deferred in (False, True):
            mp.setattr(kv_lazy, "ENABLED", deferred)
            hooks = [SpecDecoder(SpeculativeConfig(method, num_speculative_tokens=k), copy.deepcopy(acceptance))]
            cfg = padded_budget(replace(config, async_scheduling=None if method == "eagle3" else False), k)
            records.append(run_engine(specs, cfg, LinearCostModel(), token_text=TOKEN_TEXT, hooks=hooks))
    assert_identical(*records)


MOVES = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 30),
                           st.sampled_from(["grow", "grow", "grow", "preempt", "finish", "finish"])),
                 min_size=20, max_size=60)


def _kv_state(kv, requests) -> tuple:
    """Everything the manager holds, a marked block's owner named by its id."""
    hashes = [("owner", h.request_id) if type(h) is Request else h for h in kv.block_hash]
    return (list(kv.free_queue), list(kv.ref_cnt), hashes, dict(kv.cached),
            {h: list(more) for h, more in kv.more_holders.items()}, kv.lazy_blocks,
            [(req.kv_lazy, req.kv_lazy_resident, req.kv_key is None, kv.blocks_of(req)) for req in requests])


def _one_at_a_time(kv, count: int, marker=None, num_marked: int = 0) -> list[int]:
    """`_pop_free_many` as `count` `_pop_free` calls, the first `num_marked` blocks then marked."""
    taken = [kv._pop_free() for _ in range(count)]
    for block in taken[:num_marked]:
        kv.block_hash[block] = marker
    return taken


def _marked_after(kv, req, fresh: int, total: int) -> list[int]:
    """`KVCacheManager._allocate_private` as `allocate`'s general path: pop, then `cache_full_blocks`."""
    taken = kv._pop_free_many(fresh)
    kv.req_blocks[req] = taken[:]
    kv.cache_full_blocks(req, min(total, req.num_tokens))
    return taken


def _drive(kv, moves, observe) -> list:
    """Run `moves` on `kv` (names 0 and 3 share a first block; a name's requests alternate between two
    first blocks); `observe(kv, requests, hits)` after each move, into the trace returned."""
    live, requests, trace, made = {}, [], [], [0] * 6
    for name, n, move in moves:
        req = live.get(name)
        if req is None:
            first = (0 if name == 3 else name) + 10 * (made[name] % 2)
            made[name] += 1
            tokens = [first] * 4 + [100 * name + i for i in range(36)]
            req = live[name] = request(tokens, index=len(requests))
            requests.append(req)
            if kv.lazy is not None:
                kv.lazy.arrive(req, first_block_key(req, None, kv.block_size))
        hits = None
        if move == "grow":
            hits, num_hit = kv.lookup_prefix(req) if not req.num_computed_tokens else ([], 0)
            n = min(n, req.num_tokens - req.num_computed_tokens - num_hit)
            if n > 0 and kv.allocate(req, n, hits) is not None:
                req.num_computed_tokens += num_hit + n
                kv.cache_full_blocks(req)
        else:
            kv.free(req, forget=move == "finish")
            req.num_computed_tokens = 0
            if move == "finish":
                del live[name]
        trace.append(observe(kv, requests, hits))
    return trace


@given(MOVES)
def test_bulk_eviction_leaves_the_manager_as_one_pop_at_a_time(moves):
    """`_pop_free_many` settles the marked blocks it takes run by run, an owner's count at a time: the
    manager ends every move as `count` `_pop_free` calls leave it, and as marking a private admission's
    blocks after the pop (`cache_full_blocks`) leaves it, and its invariants hold. (A finished
    request's marked blocks are evicted, or hashed when the next but one of its name arrives.)"""
    from sim.core.invariants import _check_kv

    def observe(kv, requests, hits):
        _check_kv(kv)
        return _kv_state(kv, requests)
    states = []
    for variant in ("bulk", "one at a time", "marked after"):
        kv = KVCacheManager(24, 4, True)  # 23 usable blocks: a request's prompt takes 10
        assert kv.enable_private_prefixes()
        if variant == "one at a time":
            kv._pop_free_many = lambda count, *marks, kv=kv: _one_at_a_time(kv, count, *marks)
        elif variant == "marked after":  # a private admission's blocks marked by `cache_full_blocks`
            kv._allocate_private = lambda req, fresh, total, kv=kv: _marked_after(kv, req, fresh, total)
        states.append(_drive(kv, moves, observe))
    assert states[0] == states[1] == states[2]


#: MOVES over fewer names in longer steps: prompts computed whole, preempted and readmitted
READMISSIONS = st.lists(st.tuples(st.integers(0, 3), st.integers(8, 40),
                                  st.sampled_from(["grow", "grow", "preempt", "preempt", "finish"])),
                        min_size=20, max_size=60)


@given(READMISSIONS)
def test_deferred_registration_moves_blocks_as_eager_registration(moves):
    """Every lookup hits the blocks eager registration's would (a preempted private request's own
    marked ones among them), and the free queue, the counts, each request's blocks and the cached
    count are eager's after every move."""
    def observe(kv, requests, hits):
        return (hits, list(kv.free_queue), list(kv.ref_cnt), kv.num_cached_hashes,
                [kv.blocks_of(req) for req in requests])
    traces = []
    for deferred in (False, True):
        kv = KVCacheManager(24, 4, True)
        if deferred:
            assert kv.enable_private_prefixes()
        traces.append(_drive(kv, moves, observe))
    assert traces[0] == traces[1]
