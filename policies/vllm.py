"""vLLM V1's scheduler: one token budget for prefill chunks and decodes, running requests first.

Each step: every running request asks for what it lacks (a decode is 1 token, a prefill chunk up
to `long_prefill_token_threshold`), in admission order, until the budget is spent; when KV blocks
run out, the last-admitted (or lowest-priority) running request is preempted by recompute. Then, if
nobody was preempted, waiting requests are admitted in order while the budget, `max_num_seqs` and
KV blocks allow; the first that does not fit blocks those behind it (head-of-line blocking).
With chunked prefill off, a prompt must fit the remaining budget whole.

What changed between vLLM releases comes from the scheduler profile (sim.core.scheduler_profiles):
whether the threshold applies to a lone request, and whether the running pass goes on after a
priority self-preemption. Under async scheduling a request whose in-flight step already reaches
`max_tokens` is not scheduled again, and no chunk runs past `max_model_len`.
"""
from __future__ import annotations

from policies.base import EngineState, Policy, SchedulerOutput
from sim.core.request import RequestStatus
from sim.core.scheduler_profiles import get_scheduler_profile


class VllmV1Policy(Policy):
    name = "vllm"

    def __init__(self):
        self._threshold = 0

    def schedule(self, state: EngineState) -> SchedulerOutput:
        config = state.config
        profile = get_scheduler_profile(config.scheduler_profile)
        self._threshold = config.long_prefill_token_threshold
        if profile.threshold_needs_company and len(state.running) + len(state.waiting) <= 1:
            self._threshold = 0  # nobody to starve: a lone request uses the whole budget
        out = SchedulerOutput()
        budget = self.schedule_running(state, config.max_num_batched_tokens, out,
                                       profile.self_preemption_continues)
        if not out.preempted:
            self.admit_waiting(state, budget, out, whole_prompt=not config.enable_chunked_prefill)
        return out

    def prefill_threshold(self, state: EngineState) -> int:
        return self._threshold  # vLLM applies it with chunked prefill off too

    unchunked_threshold = prefill_threshold

    def schedule_running(self, state: EngineState, budget: int, out: SchedulerOutput,
                         self_preemption_continues: bool) -> int:
        running, scheduled = state.running, out.scheduled
        max_model_len = state.config.max_model_len
        resumes = self_preemption_continues and state.config.scheduling == "priority"
        kv = state.kv
        # the hot path, inlined: Policy.chunk's sizing, and KVCacheManager.allocate's growth within
        # the blocks a request holds or by one free block (fits, nobody preempted)
        plain_chunk = (type(self).chunk is Policy.chunk
                       and type(self).prefill_threshold is VllmV1Policy.prefill_threshold)
        in_place = kv.grows_in_place
        req_blocks, block_size, caching = kv.req_blocks, kv.block_size, kv.enable_prefix_caching
        hashed = kv.num_hashed_blocks
        exact = not kv.registers_at  # else no block to register below `req.kv_register_at` tokens
        threshold = self._threshold
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            placeholders = req.num_output_placeholders
            computed, prompt = req.num_computed_tokens, req.num_prompt_tokens
            max_tokens = req.sampling_params.max_tokens or max_model_len - prompt
            if placeholders and computed + 2 - placeholders >= prompt + max_tokens:
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
            if in_place:
                blocks = req_blocks.get(req)
                total = computed + n
                if blocks is not None and (total <= len(blocks) * block_size or kv.take_next_block(blocks, total)):
                    if caching and (total >= req.kv_register_at or exact):
                        target = total if total < num_tokens else num_tokens
                        done = hashed.get(req, 0)
                        if target // block_size > done:
                            kv.cache_full_blocks(req, target)
                        else:
                            req.kv_register_at = (done + 1) * block_size
                    scheduled.append((req, n))
                    budget -= n
                    i += 1
                    continue
            num_preempted = len(out.preempted)
            later = running[i + 1:] if resumes else None  # only a priority self-preemption reads it
            fits, refund = self.allocate_or_preempt(state, req, n, out)
            budget += refund
            if not fits:
                if resumes and req.status == RequestStatus.PREEMPTED:
                    i = self._position_of_first(running, later)
                    continue  # the requests after it are more important and may fit now
                break
            scheduled.append((req, n))
            budget -= n
            i = i + 1 if len(out.preempted) == num_preempted else running.index(req) + 1
        return budget

    @staticmethod
    def _position_of_first(running: list, candidates: list) -> int:
        """Where the first of `candidates` still running now sits (len(running) if none is)."""
        still = {id(r) for r in running}
        for req in candidates:
            if id(req) in still:
                return running.index(req)
        return len(running)
