"""What every scheduling policy shares: the queues it works on and the plan it returns.

A policy's `schedule(state)` decides, for this step, how many new tokens each request computes.
It moves requests between `state.waiting` and `state.running`, asks `state.kv` for blocks, and
preempts (by recompute) when blocks run out. It never touches blocks itself.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from policies.mamba_align import aligned_chunk
from sim.core.config import EngineConfig
from kernels_cost_model.errors import require
from sim.core.kv_cache import KVCacheManager
from sim.core.request import Request, RequestStatus

UNLIMITED = 1 << 62


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan: (request, num_new_tokens) in batch row order, and who was preempted.
    `num_decodes`: how many of the first rows are one-token decodes that sample (a request with every
    token computed but its last; `Policy.decode_running`), so that the engine advances them without
    testing each (0: unknown, every row is tested)."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    num_decodes: int = 0

    @property
    def total_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


@dataclass
class EngineState:
    """The queues a policy schedules from. `running` is in admission order."""

    config: EngineConfig
    kv: KVCacheManager
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    #: the waiting head's last refusal, which repeats while the budget is no larger and fewer blocks are
    #: free than it wants (`Policy._refuse`): (request, budget, blocks wanted, its `kv_lazy` then), or None
    refused: tuple | None = None


class Policy:
    """Base class: shared moves (admit, preempt, chunk sizing). Subclasses implement schedule."""

    name = "base"
    whole_prompts = False  # schedules whole prompts only: the budget must hold max_model_len
    row_slots = 0  # budget each scheduled row costs beyond its tokens (a draft model's slot: VllmV1Policy)
    pad_decodes = 0  # 1 + k: vLLM 0.33 pads a one-token admission to a decode row (`_padded_decode`)
    #: its decode steps schedule every running request, nearly always: the fast engine times their
    #: rows with one slot a step (sim.engine.shared_times), which pays only then
    shares_step_times = False
    #: a waiting request's admission depends only on it, the budget and the KV manager (no per-step
    #: state such as vLLM V1's threshold for a lone request): `admit_waiting` may remember a refusal
    refusals_repeat = False

    def schedule(self, state: EngineState) -> SchedulerOutput:
        raise NotImplementedError

    # ----- shared moves ------------------------------------------------------------------
    @staticmethod
    def lacking(req: Request, num_cached: int = 0) -> int:
        """Tokens `req` has not computed yet (beyond `num_cached` prefix-cache hits), drafts
        included, counting the tokens of steps still in flight (async scheduling) as known."""
        return (req.num_prompt_tokens + len(req.output_token_ids) + req.num_spec_tokens + req.num_output_placeholders
                - req.num_computed_tokens - num_cached)  # (`num_tokens_with_spec`'s sum, inline)

    @staticmethod
    def is_decode(req: Request) -> bool:
        """Caught up once already and lacks only the token it sampled last: a decode."""
        return req.num_tokens - req.num_computed_tokens == 1 and bool(req.output_token_ids)

    def prefill_threshold(self, state: EngineState) -> int:
        """This step's cap on one request's chunk (0: none)."""
        return state.config.long_prefill_token_threshold if state.config.enable_chunked_prefill else 0

    def unchunked_threshold(self, state: EngineState) -> int:
        """Cap on a whole-prompt admission (0: none; only vLLM V1 applies its threshold there)."""
        return 0

    def chunk(self, state: EngineState, req: Request, budget: int, num_cached: int = 0) -> int:
        """Tokens `req` would compute now: what it lacks, capped by the threshold and budget.

        A policy may override this to size chunks its own way (Sarathi fills the budget exactly).
        """
        n = self.lacking(req, num_cached)
        threshold = self.prefill_threshold(state)
        if 0 < threshold < n:
            n = threshold
        return min(n, budget)

    def try_admit(self, state: EngineState, req: Request, budget: int, out: SchedulerOutput,
                  whole_prompt: bool) -> int | None:
        """Admit the head waiting request if its chunk and blocks fit. Returns tokens used or None.

        `whole_prompt`: the request must compute everything it lacks in this step (no chunking,
        no `long_prefill_token_threshold`).
        """
        cached_blocks, num_cached = state.kv.lookup_prefix(req)
        loads = state.kv.loads_first(req)
        if loads is not False:
            return None if loads is None else self._admit_to_load(state, req, num_cached, cached_blocks)
        if whole_prompt:
            n = self.lacking(req, num_cached)
            threshold = self.unchunked_threshold(state)
            if 0 < threshold < n:
                n = threshold  # vLLM caps even an unchunked prompt's first step at the threshold
            if n > budget:
                return self._refuse(state, req, budget)
        else:
            n = self.chunk(state, req, budget, num_cached)
            if state.kv.checkpoint_tokens:  # (Mamba align mode only: off the common path)
                n = aligned_chunk(state.kv, state.config, req, n, num_cached)
        if n <= 0:
            return None
        if self.pad_decodes and self.lacking(req, num_cached) == 1:
            n = self._padded_decode(state, req, num_cached, budget, out)
            if n is None:
                return None
        kv = state.kv
        if kv.num_lookahead_tokens:
            return self._admit_with_lookahead(state, req, n, cached_blocks, num_cached, out)
        # admit only if its whole sequence fits, not just this chunk (vLLM's default)
        if not self._whole_sequence_fits(state, req, n, cached_blocks, num_cached) \
                or kv.allocate(req, n, cached_blocks) is None:
            return self._refuse(state, req, UNLIMITED, n) if whole_prompt else None
        return self._admitted(state, req, n, num_cached, out)

    def _refuse(self, state: EngineState, req: Request, budget: int, n: int | None = None) -> None:
        """`try_admit` refuses `req` (first in line) a whole prompt: `budget` does not hold it (`n` None), or
        its `n` tokens' blocks do not fit (`budget` UNLIMITED: whatever the budget). Remembers the budget
        and the free blocks it would want (`state.refused`) where the refusal repeats while `req` stays
        first, the budget is no larger and fewer blocks are free: under a policy whose admission reads
        nothing else (`refusals_repeat`, no padded decodes), with a KV manager that asks only the free
        count, where `req` hits no cached prefix whatever is cached (`KVCacheManager.refusal_repeats`;
        `req.kv_lazy` must hold still). Its tokens and the blocks it wants only grow while it waits
        (it computes none); a request admitted clears the memo."""
        kv = state.kv
        if self.refusals_repeat and not self.pad_decodes and kv.refusal_repeats(req):
            if n is not None and state.config.scheduler_reserve_full_isl:  # (the blocks grow with the tokens)
                n = max(n, req.num_tokens - req.num_computed_tokens)
            state.refused = (req, budget, UNLIMITED if n is None else kv.blocks_wanted(req, n), req.kv_lazy)
        return None

    def _whole_sequence_fits(self, state: EngineState, req: Request, n: int, cached_blocks: list[int],
                             num_cached: int) -> bool:
        """Under `scheduler_reserve_full_isl`, whether the request's whole sequence fits, not just `n`."""
        kv = state.kv
        return (not state.config.scheduler_reserve_full_isl or self._fit_is_allocations(kv, req, n, num_cached)
                or kv.can_fit(req, req.num_tokens - req.num_computed_tokens - num_cached, cached_blocks))

    def _padded_decode(self, state: EngineState, req: Request, num_cached: int, budget: int,
                       out: SchedulerOutput) -> int | None:
        """Tokens for a waiting request with one token to compute under `pad_decodes` (vLLM 0.33 with
        speculative decoding): a decode row of 1 + k, its k drafts placeholders that verification
        rejects, where no running prefill is scheduled in the step, a running row is or the request has
        tokens computed, and the row leaves room for its sample below max_model_len; else 1. None: the
        padded row does not fit the budget (admissions stop)."""
        width, computed = self.pad_decodes, req.num_computed_tokens + num_cached
        rows = out.scheduled[:len(out.scheduled) - len(out.admitted)]  # the running pass's rows
        if any(r.is_prefill_chunk for r, _ in rows) or not (rows or computed):
            return 1
        if computed + width + 1 > state.config.max_model_len:
            return 1
        return width if width <= budget else None

    def _admit_with_lookahead(self, state: EngineState, req: Request, n: int, cached_blocks: list[int],
                              num_cached: int, out: SchedulerOutput) -> int | None:
        """`try_admit` with speculative decoding's lookahead slots: neither release counts them in the
        whole-sequence check; vLLM 0.33 reserves them for a request it admits, 0.19 only from its next
        step (none for a request with nothing computed: `KVCacheManager.admission_lookahead`)."""
        kv = state.kv
        with kv.lookahead_slots(0):
            if not self._whole_sequence_fits(state, req, n, cached_blocks, num_cached):
                return None
        slots = kv.num_lookahead_tokens if kv.admission_lookahead or req.num_computed_tokens else 0
        with kv.lookahead_slots(slots):
            if kv.allocate(req, n, cached_blocks) is None:
                return None
        return self._admitted(state, req, n, num_cached, out)

    @staticmethod
    def _admitted(state: EngineState, req: Request, n: int, num_cached: int, out: SchedulerOutput) -> int:
        """Move the head waiting request, its blocks allocated, to the running list."""
        state.waiting.popleft()
        state.refused = None
        req.num_computed_tokens += num_cached   # (nonzero before only where a load landed)
        if req.status == RequestStatus.WAITING:
            req.num_cached_tokens = req.num_computed_tokens
        req.status = RequestStatus.RUNNING
        state.running.append(req)
        out.admitted.append(req)
        out.scheduled.append((req, n))
        return n

    @staticmethod
    def _admit_to_load(state: EngineState, req: Request, num_cached: int, cached_blocks: list[int]) -> int | None:
        """Admit the head waiting request to load its CPU hits first (vLLM's asynchronous load): it
        takes blocks for its hits and leaves the queue, computing nothing and using no budget (0),
        or stays (None) if its whole sequence (under `scheduler_reserve_full_isl`) or its hits do not fit."""
        kv = state.kv
        if state.config.scheduler_reserve_full_isl and not kv.can_fit(req, req.num_tokens - num_cached, cached_blocks):
            return None
        if not kv.start_load(req, cached_blocks):
            return None
        state.waiting.popleft()
        return 0

    @staticmethod
    def _fit_is_allocations(kv: KVCacheManager, req: Request, n: int, num_cached: int) -> bool:
        """Whether `kv.can_fit` for `req`'s whole sequence would ask what allocating its `n` tokens
        asks (the plain manager's blocks for computed + cached + new tokens against the free ones):
        the chunk is its whole sequence, from nothing computed."""
        return (n == req.num_prompt_tokens + len(req.output_token_ids) - num_cached and not req.num_computed_tokens
                and type(kv).can_fit is KVCacheManager.can_fit and type(kv).allocate is KVCacheManager.allocate)

    def admit_waiting(self, state: EngineState, budget: int, out: SchedulerOutput,
                      whole_prompt: bool) -> int:
        """Admit waiting requests in order while budget, `max_num_seqs` and KV allow.

        The first that does not fit blocks those behind it (head-of-line). One whose prefix is being
        loaded for another request (a CPU tier) is passed over for this step and stays first in line.
        Returns budget left.
        """
        max_num_seqs, passed = state.config.max_num_seqs, []
        slots = self.row_slots
        while state.waiting and budget > 0 and len(state.running) < max_num_seqs:
            head, refused = state.waiting[0], state.refused
            if refused is not None and refused[0] is head and budget <= refused[1] \
                    and state.kv.num_free_blocks < refused[2] and refused[3] is head.kv_lazy:
                break  # (the head's last refusal stands: `_refuse`)
            used = self.try_admit(state, head, budget, out, whole_prompt)
            if used is None:
                if state.kv.loads_first(head) is not None:
                    break
                passed.append(state.waiting.popleft())
                continue
            budget -= used + slots if used else 0  # (a request that only starts a load takes no row)
        for req in reversed(passed):
            state.waiting.appendleft(req)
        return budget

    def decode_running(self, state: EngineState, budget: int, out: SchedulerOutput,
                       reqs: list[Request] | None = None) -> int:
        """One token each for `reqs` (default: all running, which must all be decodes), in order.

        Stops when the budget is spent; when KV runs out, preempts victims by recompute (a
        preempted request is skipped). Returns the budget left.
        """
        rows = list(state.running if reqs is None else reqs)
        first = not out.scheduled  # (a preemption deletes only rows of this pass: they stay first)
        if budget >= len(rows) and state.kv.grows_in_place:  # (the budget cannot run out)
            budget = self._decode_in_place(state, budget, out, rows)
        else:
            running = RequestStatus.RUNNING
            for req in rows:
                if budget <= 0:
                    break
                if req.status is not running:
                    continue  # preempted earlier in this step
                budget += self._decode_allocating(state, req, out)
        if first:
            out.num_decodes = len(out.scheduled)
        return budget

    def _decode_in_place(self, state: EngineState, budget: int, out: SchedulerOutput, rows: list) -> int:
        """`decode_running` where the budget holds every row and `KVCacheManager.allocate`'s hot path
        is inlined: growth within the blocks a request holds or by one free block. Below a request's
        `kv_grow_at` there is neither a block to take nor one to register: the row is scheduled at
        once; else the blocks are checked and the bound moves on. The budget is settled at the end
        and around each row that takes `_decode_allocating`: the rows scheduled in between are the
        in-place ones, one token each."""
        kv, running = state.kv, RequestStatus.RUNNING
        scheduled = out.scheduled  # (a preemption deletes from the same list)
        schedule = scheduled.append
        blocks_of, block_size, caching = kv.req_blocks.get, kv.block_size, kv.enable_prefix_caching
        hashed_get, take_next_block = kv.num_hashed_blocks.get, kv.take_next_block
        exact = not kv.registers_at  # else no block to register below `req.kv_register_at` tokens
        bounded = not (caching and exact)  # (an exact check on every row keeps no bound)
        mark = len(scheduled)  # the rows after it are in-place rows
        for req in rows:
            if req.status is not running:
                continue  # preempted earlier in this step
            total = req.num_computed_tokens + 1
            if total < req.kv_grow_at:
                schedule((req, 1))
                continue
            blocks = blocks_of(req)
            if blocks is not None and (total <= len(blocks) * block_size or take_next_block(blocks, total)):
                # (the same lines as VllmV1Policy._grow_in_place's, inline in both: a helper's call,
                # made for one row in ~8, cost ~1 % of a run's bytecodes)
                if caching and (total >= req.kv_register_at or exact):
                    target = req.num_prompt_tokens + len(req.output_token_ids)
                    if total < target:
                        target = total
                    done = hashed_get(req, 0)
                    if target // block_size > done:
                        kv.cache_full_blocks(req, target)
                    else:
                        req.kv_register_at = (done + 1) * block_size
                if bounded:
                    grow_at = len(blocks) * block_size + 1
                    req.kv_grow_at = req.kv_register_at if caching and req.kv_register_at < grow_at else grow_at
                schedule((req, 1))
                continue
            budget -= len(scheduled) - mark
            budget += self._decode_allocating(state, req, out)
            mark = len(scheduled)
        return budget - (len(scheduled) - mark)

    def _decode_allocating(self, state: EngineState, req: Request, out: SchedulerOutput) -> int:
        """Schedule one token for `req` if `allocate_or_preempt` keeps it; the change to the budget."""
        fits, refund = self.allocate_or_preempt(state, req, 1, out)
        if fits:
            out.scheduled.append((req, 1))
        return refund - fits

    @staticmethod
    def require_whole_prompt_budget(config: EngineConfig) -> None:
        """Whole-prompt policies: the longest prompt (or recompute) must fit one step's budget."""
        if config.max_num_batched_tokens >= config.max_model_len:
            return  # (checked every step: no error message built when it holds)
        require(config.max_num_batched_tokens >= config.max_model_len, "engine.max_num_batched_tokens",
                config.max_num_batched_tokens,
                f"must be >= max_model_len={config.max_model_len} with policy={config.policy!r}:"
                " it schedules whole prompts, so a longer prompt could never run")

    @staticmethod
    def preempt(state: EngineState, victim: Request, out: SchedulerOutput) -> int:
        """Preempt by recompute: drop its KV, forget computed tokens, put it first in line.

        Returns the tokens it had been given earlier in this step (refunded to the budget).
        """
        refund = 0
        for i, (req, n) in enumerate(out.scheduled):
            if req is victim:
                refund = n
                del out.scheduled[i]
                break
        state.running.remove(victim)
        state.kv.free(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_spec_tokens = 0  # its drafts are dropped with its KV
        # its in-flight tokens still arrive; its placeholders go (they stay counted in flight)
        victim.num_stale_tokens = victim.num_in_flight_extra = victim.num_in_flight_tokens
        victim.num_output_placeholders = 0
        victim.num_preemptions += 1
        state.waiting.appendleft(victim)
        out.preempted.append(victim)
        return refund

    @staticmethod
    def pick_victim(state: EngineState) -> Request:
        """Last admitted running request; under priority scheduling the least important one."""
        if state.config.scheduling == "priority":
            return max(state.running, key=lambda r: (r.priority, r.arrival_time, r.index))
        return state.running[-1]

    def allocate_or_preempt(self, state: EngineState, req: Request, n: int,
                            out: SchedulerOutput) -> tuple[bool, int]:
        """Allocate blocks for a running request, preempting others until it fits.

        Returns (False if `req` itself had to be preempted, tokens refunded by preemptions).
        """
        refund = 0
        while state.kv.allocate(req, n) is None:
            victim = self.pick_victim(state)
            if victim is req:  # (a request the cache can never hold is named, not readmitted for ever)
                state.kv.require_ever_fits(req, req.num_computed_tokens + n)
                return False, refund + self.preempt(state, victim, out)
            refund += self.preempt(state, victim, out)
        return True, refund

