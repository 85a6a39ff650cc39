"""vLLM V0's default scheduler: a step is all-prefill or all-decode, prefills first.

Each step: waiting requests are admitted in order with their whole prompt while
`max_num_batched_tokens`, `max_num_seqs` and KV blocks allow (head-of-line). If anyone was
admitted the step runs only those prefills; otherwise every running request decodes one token,
preempting the last-admitted (or lowest-priority) request by recompute when KV runs out.
Chunked prefill does not apply: prompts always run whole.
"""
from __future__ import annotations

from policies.base import EngineState, Policy, SchedulerOutput


class VllmV0Policy(Policy):
    name = "vllm-v0"
    whole_prompts = True
    shares_step_times = True  # (a step runs the admitted prompts only, or every running request)
    refusals_repeat = True

    def schedule(self, state: EngineState) -> SchedulerOutput:
        self.require_whole_prompt_budget(state.config)
        out = SchedulerOutput()
        budget = state.config.max_num_batched_tokens
        self.admit_waiting(state, budget, out, whole_prompt=True)
        if not out.scheduled:
            self.decode_running(state, budget, out)
        return out
