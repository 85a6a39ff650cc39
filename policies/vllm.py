"""vLLM V1's scheduler: one token budget for prefill chunks and decodes, running requests first.

Each step: every running request asks for what it lacks (a decode is 1 token, a prefill chunk up
to `long_prefill_token_threshold`), in admission order, until the budget is spent; when KV blocks
run out, the last-admitted (or lowest-priority) running request is preempted by recompute. Then, if
nobody was preempted, waiting requests are admitted in order while the budget, `max_num_seqs` and
KV blocks allow; the first that does not fit blocks those behind it (head-of-line blocking).
With chunked prefill off, a prompt must fit the remaining budget whole.
"""
from __future__ import annotations

from policies.base import EngineState, Policy, SchedulerOutput


class VllmV1Policy(Policy):
    name = "vllm"

    def schedule(self, state: EngineState) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.schedule_running(state, state.config.max_num_batched_tokens, out)
        if not out.preempted:
            self.admit_waiting(state, budget, out, whole_prompt=not state.config.enable_chunked_prefill)
        return out

    def schedule_running(self, state: EngineState, budget: int, out: SchedulerOutput) -> int:
        running, scheduled = state.running, out.scheduled
        block_size = state.config.block_size
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            if (req.num_tokens_with_spec - computed == 1 and computed % block_size
                    and not state.kv.num_lookahead_tokens):
                scheduled.append((req, 1))  # a decode inside its last block: no new KV needed
                budget -= 1
                i += 1
                continue
            n = self.chunk(state, req, budget)
            if n <= 0:
                i += 1
                continue
            num_preempted = len(out.preempted)
            fits, refund = self.allocate_or_preempt(state, req, n, out)
            budget += refund
            if not fits:
                break
            scheduled.append((req, n))
            budget -= n
            i = i + 1 if len(out.preempted) == num_preempted else running.index(req) + 1
        return budget
