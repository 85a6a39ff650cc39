"""Orca (OSDI'22): iteration-level batching with whole prefills.

Each step: every running request decodes one token (all of them are decoding: prompts run whole),
then waiting requests are admitted in order with their whole prompt while `max_num_seqs`, the
remaining `max_num_batched_tokens` and KV blocks allow; a prompt that does not fit blocks those
behind it (head-of-line). When KV runs out, the last-admitted request is preempted by recompute,
and nobody is admitted in that step. Prompts are never chunked.
"""
from __future__ import annotations

from policies.base import EngineState, Policy, SchedulerOutput


class OrcaPolicy(Policy):
    name = "orca"
    whole_prompts = True

    def schedule(self, state: EngineState) -> SchedulerOutput:
        self.require_whole_prompt_budget(state.config)
        out = SchedulerOutput()
        budget = self.decode_running(state, state.config.max_num_batched_tokens, out)
        if not out.preempted:
            self.admit_waiting(state, budget, out, whole_prompt=True)
        return out
