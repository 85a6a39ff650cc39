"""vLLM V1's scheduler: one token budget for prefill chunks and decodes, running requests first.

Each step: every running request asks for what it lacks (a decode is 1 token, a prefill chunk up
to `long_prefill_token_threshold`), in admission order, until the budget is spent; when KV blocks
run out, the last-admitted (or lowest-priority) running request is preempted by recompute. Then, if
nobody was preempted, waiting requests are admitted in order while the budget, `max_num_seqs` and
KV blocks allow; the first that does not fit blocks those behind it (head-of-line blocking).
With chunked prefill off, a prompt must fit the remaining budget whole.

What changed between vLLM releases comes from the scheduler profile (sim.core.scheduler_profiles):
whether the threshold applies to a lone request, whether the running pass goes on after a
priority self-preemption, and where it goes on after a priority victim that sat earlier in it.
Under async scheduling a request whose in-flight step already reaches `max_tokens` is not
scheduled again, and no chunk runs past `max_model_len`.
"""
from __future__ import annotations

from itertools import islice

from policies.base import EngineState, Policy, SchedulerOutput
from policies.mamba_align import aligned_chunk
from sim.core.request import RequestStatus
from sim.core.scheduler_profiles import SchedulerProfile, get_scheduler_profile


class VllmV1Policy(Policy):
    name = "vllm"
    #: Slots the drafter adds to the batch per scheduled request (vLLM's `max_num_new_slots_for_drafting`:
    #: 1 for a draft model, which runs over the verified tokens plus one; 0 for EAGLE, MTP and n-gram). Set
    #: by the speculative decoding hook.
    draft_slots = 0

    def __init__(self):
        self._threshold = 0
        self.row_slots = 0  # (set by `_draft_budget` where the drafter has slots)

    def schedule(self, state: EngineState) -> SchedulerOutput:
        config = state.config
        profile = get_scheduler_profile(config.scheduler_profile)
        self._threshold = config.long_prefill_token_threshold
        if profile.threshold_needs_company and len(state.running) + len(state.waiting) <= 1:
            self._threshold = 0  # nobody to starve: a lone request uses the whole budget
        state.kv.new_step_starts()
        out = SchedulerOutput()
        budget = self._draft_budget(config, profile) if self.draft_slots else config.max_num_batched_tokens
        budget = self.schedule_running(state, budget, out, profile)
        if not out.preempted:
            self.admit_waiting(state, budget, out, whole_prompt=not config.enable_chunked_prefill)
        return out

    def _draft_budget(self, config, profile) -> int:
        """With a drafter's slots: the tokens the step's first row may take, and `row_slots`, what each row
        then costs beyond its tokens. vLLM 0.19 takes the slots off the budget for every seat at once
        (`max_num_scheduled_tokens` = budget - slots x max_num_seqs); 0.33 charges each scheduled row its
        slots (`input_budget -= num_new_tokens + draft_slots`, a row taking at most what leaves them)."""
        budget, slots = config.max_num_batched_tokens, self.draft_slots
        if profile.release == "0.19":
            self.row_slots = 0
            return budget - slots * config.max_num_seqs
        self.row_slots = slots
        return budget - slots

    def prefill_threshold(self, state: EngineState) -> int:
        return self._threshold  # vLLM applies it with chunked prefill off too

    unchunked_threshold = prefill_threshold

    def schedule_running(self, state: EngineState, budget: int, out: SchedulerOutput,
                         profile: SchedulerProfile) -> int:
        running, scheduled = state.running, out.scheduled
        resumes = profile.self_preemption_continues and state.config.scheduling == "priority"
        slots = self.row_slots
        in_place = state.kv.grows_in_place and not slots  # (the hot path charges no slots)
        i = 0
        while i < len(running) and budget > 0:
            if in_place:  # the rows that grow within their blocks or by one free block: the hot path
                i, budget = self._grow_in_place(state, i, budget, out)
                if i >= len(running) or budget <= 0:
                    break
            req = running[i]
            n = self._tokens_for(state, req, budget)
            if n <= 0:
                i += 1  # nothing to compute, or its in-flight step already samples its last token
                continue
            num_preempted, num_rows = len(out.preempted), len(scheduled)
            later = running[i + 1:] if resumes else None  # only a priority self-preemption reads it
            fits, refund = self.allocate_or_preempt(state, req, n, out)
            budget += refund + slots * (num_rows - len(scheduled))  # (a victim's row gives its slots back)
            if not fits:
                if resumes and req.status == RequestStatus.PREEMPTED:
                    i = self._position_of_first(running, later)
                    continue  # the requests after it are more important and may fit now
                break
            scheduled.append((req, n))
            budget -= n + slots
            if len(out.preempted) == num_preempted:
                i += 1
            elif profile.skips_after_unscheduled_victim:
                i += len(scheduled) - num_rows  # back one place only per row of this step a victim took
            else:
                i = running.index(req) + 1
        if out.preempted:
            out.num_decodes = 0  # (a preemption may have taken one of the first rows out)
        return budget

    def _tokens_for(self, state: EngineState, req, budget: int) -> int:
        """Tokens running request `req` computes now: what it lacks (`Policy.chunk`), short of
        max_model_len; 0 where its step in flight (async) already samples its last token."""
        max_model_len = state.config.max_model_len
        placeholders, computed = req.num_output_placeholders, req.num_computed_tokens
        prompt = req.num_prompt_tokens
        if placeholders and computed + 2 - placeholders >= prompt + (req.sampling_params.max_tokens
                                                                    or max_model_len - prompt):
            return 0
        n = min(self.chunk(state, req, budget), max_model_len - 1 - computed)
        return aligned_chunk(state.kv, state.config, req, n) if state.kv.checkpoint_tokens else n

    def _grow_in_place(self, state: EngineState, start: int, budget: int, out: SchedulerOutput) -> tuple[int, int]:
        """Schedule the running requests from `start` on while each fits within the blocks it holds or
        one more free block (`KVCacheManager.allocate`'s growth, inlined with `_tokens_for`: this runs
        for every row of every step). Returns (the first request it left for the caller, the budget
        left); it never preempts, so the running list does not change under it. Below a request's
        `kv_grow_at` there is neither a block to take nor one to register (`Policy._decode_in_place`).
        When it plans the step's first rows it counts the one-token decodes that sample among them,
        up to the first row that is not one (`SchedulerOutput.num_decodes`)."""
        scheduled = out.scheduled
        leading = not scheduled  # still counting the plan's first rows
        decodes = 0
        kv, max_model_len, threshold = state.kv, state.config.max_model_len, self._threshold
        plain_chunk = (type(self).chunk is Policy.chunk
                       and type(self).prefill_threshold is VllmV1Policy.prefill_threshold)
        req_blocks, block_size, caching = kv.req_blocks, kv.block_size, kv.enable_prefix_caching
        hashed, take_next_block = kv.num_hashed_blocks, kv.take_next_block
        exact = not kv.registers_at  # else no block to register below `req.kv_register_at` tokens
        bounded = not (caching and exact)  # (an exact check on every row keeps no bound)
        i = start
        for req in (islice(state.running, start, None) if start else state.running):
            if budget <= 0:
                break
            placeholders, computed = req.num_output_placeholders, req.num_computed_tokens
            prompt = req.num_prompt_tokens
            if placeholders and computed + 2 - placeholders >= prompt + (req.sampling_params.max_tokens
                                                                        or max_model_len - prompt):
                i += 1  # its in-flight step already samples its last token
                continue
            num_tokens = prompt + len(req.output_token_ids)
            if plain_chunk:
                n = num_tokens + req.num_spec_tokens + placeholders - computed
                if 0 < threshold < n:
                    n = threshold
                if n > budget:
                    n = budget
                if n > max_model_len - 1 - computed:
                    n = max_model_len - 1 - computed
            else:
                n = min(self.chunk(state, req, budget), max_model_len - 1 - computed)
            if n <= 0:
                i += 1
                continue
            total = computed + n
            if total >= req.kv_grow_at:  # (below it: no block to take nor to register)
                blocks = req_blocks.get(req)
                if blocks is None or (total > len(blocks) * block_size and not take_next_block(blocks, total)):
                    break  # it needs `allocate` (or a preemption)
                if caching and (total >= req.kv_register_at or exact):
                    target = total if total < num_tokens else num_tokens
                    done = hashed.get(req, 0)
                    if target // block_size > done:
                        kv.cache_full_blocks(req, target)
                    else:
                        req.kv_register_at = (done + 1) * block_size
                if bounded:
                    grow_at = len(blocks) * block_size + 1
                    req.kv_grow_at = req.kv_register_at if caching and req.kv_register_at < grow_at else grow_at
            scheduled.append((req, n))
            budget -= n
            i += 1
            if leading:
                if n == 1 and total >= num_tokens + placeholders:
                    decodes += 1
                else:
                    leading = False
        if decodes:
            out.num_decodes = decodes
        return i, budget

    @staticmethod
    def _position_of_first(running: list, candidates: list) -> int:
        """Where the first of `candidates` still running now sits (len(running) if none is)."""
        still = {id(r) for r in running}
        for req in candidates:
            if id(req) in still:
                return running.index(req)
        return len(running)
