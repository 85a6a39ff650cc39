"""Static (request-level) batching: the baseline every iteration-level scheduler beats.

When nothing is running, a batch is admitted: waiting requests in order, with their whole prompt,
while `max_num_seqs`, `max_num_batched_tokens` and KV blocks allow (head-of-line). Then only that
batch runs, one decode per request per step, with no new admissions until every request in it has
finished; finished requests leave and their slots stay empty. When KV runs out the last-admitted
request is preempted by recompute: it leaves the batch and heads the queue for the next one.
"""
from __future__ import annotations

from policies.base import EngineState, Policy, SchedulerOutput


class StaticBatchingPolicy(Policy):
    name = "static"
    whole_prompts = True

    def schedule(self, state: EngineState) -> SchedulerOutput:
        self.require_whole_prompt_budget(state.config)
        out = SchedulerOutput()
        budget = state.config.max_num_batched_tokens
        if state.running:
            self.decode_running(state, budget, out)
        else:
            self.admit_waiting(state, budget, out, whole_prompt=True)
        return out
