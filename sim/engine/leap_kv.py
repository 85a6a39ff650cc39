"""The KV side of a leap: the block allocations and prefix-cache registrations of a quiet stretch.

A running request decoding one token a step crosses into a new block every `block_size` steps and fills
one every `block_size` steps: both are known in closed form. The stretch is cut before the first
crossing that would find no free block (a preemption) and before anything that could let the waiting
head in; the moves are then replayed in the step-by-step engine's order (block ids and the free queue's
order matter for later prefix-cache hits), and the KV counters recorded after each step.
"""
from __future__ import annotations

from itertools import islice

import numpy as np


class StretchKV:
    """Mixed into the leap's stretch plan, which owns `kv`, `rows`, `engine`, `prompts`, `outputs`,
    `computed`, `num_rows`, `units`, `admission_first` (the policy tries the waiting head with the
    whole budget), `_append_tokens` and `_truncate_tokens`; `_kv_limit` sets `events`."""

    def _kv_limit(self, units: int) -> int:
        """Units whose block allocations all fit and cannot let the waiting head in. Builds the
        ordered KV events: (unit, row, pops a block, registers full blocks up to a token count)."""
        kv, bs = self.kv, self.kv.block_size
        held = np.array([len(kv.req_blocks.get(r, ())) for r in self.rows], dtype=np.int64)
        first_pop = held * bs + 1 - self.computed   # unit of the first block crossing
        if (first_pop < 1).any():
            return 0
        pop_units, pop_rows = periodic(first_pop, bs, units)
        reg_units, reg_rows = self._registrations(units)
        # events sorted by (unit, row); a pop comes before its row's registration in one allocate
        units_all = np.concatenate((pop_units, reg_units))
        rows_all = np.concatenate((pop_rows, reg_rows))
        kinds = np.concatenate((np.zeros(len(pop_units), np.int64), np.ones(len(reg_units), np.int64)))
        order = np.lexsort((kinds, rows_all, units_all))
        units_all, rows_all, kinds = units_all[order], rows_all[order], kinds[order]
        free = len(kv.free_queue)
        pops = np.flatnonzero(kinds == 0)
        if len(pops) > free:
            units = min(units, int(units_all[pops[free]]) - 1)
        units = min(units, self._admission_limit(units_all, rows_all, kinds, pops[:free], units))
        keep = units_all <= units
        self.events = (units_all[keep].tolist(), rows_all[keep].tolist(), kinds[keep].tolist())
        return units

    def _registrations(self, units: int):
        """(unit, row) of every allocate that registers new full blocks: the target is
        prompt + output - 1 + u tokens at unit u."""
        if not self.kv.enable_prefix_caching:
            empty = np.zeros(0, np.int64)
            return empty, empty
        bs = self.kv.block_size
        hashed = np.array([self.kv.num_hashed_blocks.get(r, 0) for r in self.rows], dtype=np.int64)
        base = self.prompts + self.outputs - 1          # target at unit u is base + u
        first_target_blocks = (base + 1) // bs
        at_one = first_target_blocks > hashed
        # later registrations: units where base + u is a multiple of bs (u >= 2)
        first_multiple = (-(base + 2)) % bs + 2
        u_multi, r_multi = periodic(first_multiple, bs, units)
        rows_one = np.flatnonzero(at_one)
        return (np.concatenate((np.ones(len(rows_one), np.int64), u_multi)),
                np.concatenate((rows_one, r_multi)))

    def _admission_limit(self, units_all, rows_all, kinds, pops, units: int) -> int:
        """Units during which the waiting head stays out. The policy tries it after the running
        pass when a seat and budget are left; with `scheduler_reserve_full_isl` it needs blocks for
        its whole sequence. Those only grow scarcer unless a block of its prefix chain is registered
        or evicted (the cache hits it would get change): the stretch ends before that."""
        state = self.engine.state
        config = state.config
        budget = config.max_num_batched_tokens
        if not self.admission_first:
            budget -= self.num_rows
        if not state.waiting or len(state.running) >= config.max_num_seqs or budget <= 0:
            return units
        head = state.waiting[0]
        if not config.scheduler_reserve_full_isl:
            return 0
        kv = self.kv
        cached_blocks, num_cached = kv.lookup_prefix(head)
        if kv.can_fit(head, head.num_tokens - num_cached, cached_blocks):
            return 0
        if not kv.enable_prefix_caching:
            return units
        max_blocks = (head.num_tokens - 1) // kv.block_size
        chain = set(kv.req_hashes.get(head, ())[:max_blocks])
        if not chain:
            return units
        block_hash = kv.block_hash
        for i, block in enumerate(islice(kv.free_queue, len(pops))):
            if block_hash[block] in chain:
                units = min(units, int(units_all[pops[i]]) - 1)
                break
        self._append_tokens(units)   # the hashes below read the tokens
        targets = self.prompts + self.outputs - 1
        for u, r, kind in zip(units_all.tolist(), rows_all.tolist(), kinds.tolist()):
            if u > units:
                break
            if kind == 1:
                req = self.rows[r]
                num_full = int(targets[r] + u) // kv.block_size
                if any(h in chain for h in kv._hashes(req, num_full)[kv.num_hashed_blocks.get(req, 0):num_full]):
                    units = u - 1
                    break
        self._truncate_tokens()
        return units

    def _replay_kv(self):
        """Make the stretch's block allocations and registrations in order (its tokens already
        appended); the KV counters after each unit (used, cached, free) as arrays."""
        kv, units = self.kv, self.units
        used = np.empty(units + 1, np.int64)
        cached = np.empty(units + 1, np.int64)
        seen = np.zeros(units + 1, bool)
        seen[0] = True
        used[0], cached[0] = kv.num_used_blocks, len(kv.cached)
        unit_list, row_list, kind_list = self.events
        if kind_list:  # (the stretch's tokens are appended already: the hashes read them)
            if kv.enable_prefix_caching:  # hash each row's new full blocks in one go (memoised)
                req_hashes, bs = kv.req_hashes, kv.block_size
                for req, target in zip(self.rows, (self.prompts + self.outputs - 1 + units).tolist()):
                    if len(req_hashes.get(req, ())) < target // bs:
                        kv._hashes(req, target // bs)
            targets = (self.prompts + self.outputs - 1).tolist()
            rows, req_blocks, total = self.rows, kv.req_blocks, kv.num_gpu_blocks - 1
            free_queue, kv_cached = kv.free_queue, kv.cached
            register = _registrar(kv)
            for u, r, kind in zip(unit_list, row_list, kind_list):
                req = rows[r]
                if kind == 0:
                    req_blocks[req].append(kv._pop_free())
                else:
                    register(req, targets[r] + u)
                used[u] = total - len(free_queue)
                cached[u] = len(kv_cached)
                seen[u] = True
        index = np.maximum.accumulate(np.where(seen, np.arange(units + 1), 0))
        used, cached = used[index][1:], cached[index][1:]
        return used, cached, (kv.num_gpu_blocks - 1) - used


def _registrar(kv):
    """`kv.cache_full_blocks(req, num_tokens)` for a plain manager with prefix caching on, as one
    closure over its tables (a stretch registers a block per row every `block_size` steps)."""
    block_size, hashed, req_hashes, req_blocks = kv.block_size, kv.num_hashed_blocks, kv.req_hashes, kv.req_blocks
    block_hash, cached = kv.block_hash, kv.cached

    def register(req, num_tokens: int) -> None:
        num_full = num_tokens // block_size
        done = hashed.get(req, 0)
        if num_full <= done:
            return
        hashes = req_hashes.get(req)
        if hashes is None or len(hashes) < num_full:
            hashes = kv._hashes(req, num_full)
        blocks = req_blocks[req]
        for i in range(done, num_full):
            block = blocks[i]
            if block_hash[block] is None:
                block_hash[block] = h = hashes[i]
                if h in cached:
                    kv._register(h, block)
                else:
                    cached[h] = block
        hashed[req] = num_full
    return register


def periodic(first: np.ndarray, period: int, last: int):
    """(unit, row) pairs for units first[r], first[r] + period, ... up to `last`, over rows r."""
    counts = np.where(first <= last, (last - first) // period + 1, 0)
    total = int(counts.sum())
    if not total:
        empty = np.zeros(0, np.int64)
        return empty, empty
    rows = np.repeat(np.arange(len(first)), counts)
    starts = np.cumsum(counts) - counts
    within = np.arange(total) - np.repeat(starts, counts)
    return first[rows] + within * period, rows
