"""The KV side of a leap: the block allocations and prefix-cache registrations of a quiet stretch.

A running request decoding one token a step crosses into a new block every `block_size` steps and fills
one every `block_size` steps: both are known in closed form. The stretch is cut before the first
crossing that would find no free block (a preemption) and before anything that could let the waiting
head in; the moves are then replayed in the step-by-step engine's order (block ids and the free queue's
order matter for later prefix-cache hits), and the KV counters recorded after each step.
"""
from __future__ import annotations

from itertools import repeat


def waiting_head(state, num_rows: int, admission_first: bool):
    """The waiting request the policy will try after a pure-decode pass of `num_rows` rows (a seat
    and token budget are left), or None."""
    config = state.config
    budget = config.max_num_batched_tokens
    if not admission_first:
        budget -= num_rows
    if not state.waiting or len(state.running) >= config.max_num_seqs or budget <= 0:
        return None
    return state.waiting[0]


def head_may_enter(state, num_rows: int, admission_first: bool) -> bool:
    """Whether the waiting head could be admitted at the next step as the KV cache is now: always
    without `scheduler_reserve_full_isl`, else when blocks for its whole sequence fit (at once where
    they fit with no prefix hit: a waiting request holds no blocks, and a hit saves a fresh block or
    revives a free one; the leap's managers take no lookahead)."""
    head = waiting_head(state, num_rows, admission_first)
    if head is None:
        return False
    if not state.config.scheduler_reserve_full_isl:
        return True
    kv = state.kv
    if -(-head.num_tokens // kv.block_size) <= len(kv.free_queue):
        return True
    cached_blocks, num_cached = kv.lookup_prefix(head)
    return kv.can_fit(head, head.num_tokens - num_cached, cached_blocks)


class StretchKV:
    """Mixed into the leap's stretch plan, which owns `kv`, `rows`, `engine`, `lag`, `outputs`,
    `computed`, `skips`, `num_rows`, `units`, `admission_first` (the policy tries the waiting head
    with the whole budget), `_append_tokens` and `_truncate_tokens`; `_kv_limit` sets `events`."""

    def _kv_limit(self, units: int) -> int:
        """Units whose block allocations all fit and cannot let the waiting head in. Builds the
        ordered KV events: (unit, row, pops a block, registers full blocks up to a token count).
        Plain Python: a stretch has a few dozen events, fewer than numpy's fixed costs repay."""
        kv, bs = self.kv, self.kv.block_size
        req_blocks = kv.req_blocks
        computed = self.computed
        events = []
        for r, req in enumerate(self.rows):
            u = len(req_blocks.get(req, ())) * bs + 1 - computed[r]   # unit of its first block crossing
            if u < 1:
                return 0
            while u <= units:
                events.append((u, r, 0))
                u += bs
        num_pops, most = len(events), units
        if kv.enable_prefix_caching:
            self._registrations(units, events)
        # sorted by (unit, row); a pop comes before its row's registration in one allocate
        events.sort()
        free = kv.num_free_blocks
        if num_pops > free:  # up to the unit before the first pop that finds no free block
            units = [event[0] for event in events if not event[2]][free] - 1
        units = min(units, self._admission_limit(events, units))
        self.events = events if units == most else [event for event in events if event[0] <= units]
        return units

    def _registrations(self, units: int, events: list) -> None:
        """Add (unit, row, 1) for every allocate that registers new full blocks: the target
        (`_target`) is prompt + output - 1 + u tokens at unit u, one less from unit 2 on for a row
        that skips unit 1 (its outputs lag a unit behind its computed tokens)."""
        bs, hashed, lag = self.kv.block_size, self.kv.num_hashed_blocks, self.lag
        for r, (req, computed, skip) in enumerate(zip(self.rows, self.computed, self.skips or repeat(0))):
            base = computed - lag + skip   # prompt + output - 1
            if (base + 1) // bs > hashed.get(req, 0):
                events.append((1, r, 1))
            u = (-(base + 2)) % bs + 2 + skip   # later ones: base + u - skip a multiple of bs
            while u <= units:
                events.append((u, r, 1))
                u += bs

    def _target(self, r: int, u: int) -> int:
        """The token count row r's allocate at unit u registers full blocks up to."""
        target = self.computed[r] - self.lag + u   # prompt + output - 1 + u, less its skip (u > 1)
        return target + self.skips[r] if u == 1 and self.skips is not None else target

    def _admission_limit(self, events: list, units: int) -> int:
        """Units during which the waiting head stays out. The policy tries it when a seat and budget
        are left; with `scheduler_reserve_full_isl` it needs blocks for its whole sequence
        (`head_may_enter` has refused the stretch where they do not fit now): need = its blocks less
        its prefix hits that running requests hold, against the free blocks. A block taken from the
        free queue lowers the free count by one and lowers the need by at most one (an evicted
        hit whose hash another, held block also has: the hit moves there; else the chain only
        shortens), so the head stays out, until a running row registers a block of the head's
        prefix chain (new hits): the stretch ends before that."""
        head = waiting_head(self.engine.state, self.num_rows, self.admission_first)
        if head is None:
            return units
        kv = self.kv
        if not kv.enable_prefix_caching:
            return units
        max_blocks = (head.num_tokens - 1) // kv.block_size
        chain = set(kv.req_hashes.get(head, ())[:max_blocks])
        if not chain:
            return units
        self._append_tokens(units)   # the hashes below read the tokens
        for u, r, kind in events:
            if u > units:
                break
            if kind == 1:
                req = self.rows[r]
                num_full = self._target(r, u) // kv.block_size
                if any(h in chain for h in kv._hashes(req, num_full)[kv.num_hashed_blocks.get(req, 0):num_full]):
                    units = u - 1
                    break
        self._truncate_tokens()
        return units

    def _replay_kv(self):
        """Make the stretch's block allocations and registrations in order (its tokens already
        appended); the KV counters after each unit (used, cached, free) as lists."""
        kv, units = self.kv, self.units
        used, cached = [], []
        if self.events:  # (the stretch's tokens are appended already: the hashes read them)
            self._replay_events(used, cached)
        total = kv.num_gpu_blocks - 1
        used_now, cached_now = total - len(kv.free_queue), kv.num_cached_hashes
        gap = units - len(used)
        used.extend([used_now] * gap)
        cached.extend([cached_now] * gap)
        return used, cached, [total - x for x in used]

    def _replay_events(self, used: list, cached: list) -> None:
        """The events' moves, in order, recording the counters of each unit before the last
        event's: a pop takes the free queue's head, a registration is `kv.cache_full_blocks` up to
        the row's target (`_target`, inline)."""
        kv, rows, computed, skips, lag = self.kv, self.rows, self.computed, self.skips, self.lag
        req_blocks, free_queue = kv.req_blocks, kv.free_queue
        total, pop_free, register = kv.num_gpu_blocks - 1, kv._pop_free, kv.cache_full_blocks
        unit = 0  # the unit whose events are being made; the units before it are recorded
        for u, r, kind in self.events:
            if u != unit:   # units before u ended with the counters as they are now
                gap = u - 1 - len(used)
                used.extend([total - len(free_queue)] * gap)
                cached.extend([kv.num_cached_hashes] * gap)
                unit = u
            if kind == 0:
                req_blocks[rows[r]].append(pop_free())
            else:
                register(rows[r], computed[r] - lag + u + (skips[r] if u == 1 and skips is not None else 0))
