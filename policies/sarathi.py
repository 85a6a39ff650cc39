"""Sarathi-Serve (OSDI'24): stall-free batching under a fixed token budget.

Each step fills `max_num_batched_tokens` (the chunk budget) in this order: first one token for
every running decode (so decodes never stall behind a prefill), then chunks of ongoing partial
prefills, then new admissions in arrival order (head-of-line, up to `max_num_seqs`). A prompt is
chunked to fill exactly the leftover budget; `long_prefill_token_threshold` and
`enable_chunked_prefill` do not apply. When KV runs out, the last-admitted (or lowest-priority)
request is preempted by recompute, and nobody is admitted in that step.
"""
from __future__ import annotations

from policies.base import EngineState, Policy, SchedulerOutput
from sim.core.request import Request, RequestStatus


class SarathiPolicy(Policy):
    name = "sarathi"

    def schedule(self, state: EngineState) -> SchedulerOutput:
        out = SchedulerOutput()
        decodes, prefills = [], []
        for req in state.running:
            (decodes if self.is_decode(req) else prefills).append(req)
        budget = self.decode_running(state, state.config.max_num_batched_tokens, out, decodes)
        budget = self.continue_prefills(state, budget, out, prefills)
        if not out.preempted:
            self.admit_waiting(state, budget, out, whole_prompt=False)
        return out

    def chunk(self, state: EngineState, req: Request, budget: int, num_cached: int = 0) -> int:
        """What the request lacks, cut to the leftover budget: no per-request threshold."""
        return min(self.lacking(req, num_cached), budget)

    def continue_prefills(self, state: EngineState, budget: int, out: SchedulerOutput,
                          prefills: list[Request]) -> int:
        """Next chunk of each ongoing prefill, in admission order. Returns the budget left."""
        for req in prefills:
            if budget <= 0:
                break
            if req.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this step
            n = self.chunk(state, req, budget)
            fits, refund = self.allocate_or_preempt(state, req, n, out)
            budget += refund
            if fits:
                out.scheduled.append((req, n))
                budget -= n
        return budget
