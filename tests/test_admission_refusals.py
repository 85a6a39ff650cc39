"""A refused waiting head is remembered (`Policy._refuse`) and passed over, untried, while the refusal
stands: every such pass-over must be a refusal that trying the head again would repeat."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from policies.vllm_v0 import VllmV0Policy
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.engine.simulation import run_engine
from tests.engine_harness import EOS, drive, engine_configs, make_engine, scripted_specs
from workloads import poisson_workload


class CheckedV0(VllmV0Policy):
    """vLLM V0's policy that tries again each head `admit_waiting` passed over untried (with room for
    it: budget and a seat) and asserts the refusal; the remembered refusal is kept as it was."""

    def __init__(self):
        self.tried: list = []
        self.passed_over = 0

    def try_admit(self, state, req, budget, out, whole_prompt):
        self.tried.append(req)
        return super().try_admit(state, req, budget, out, whole_prompt)

    def admit_waiting(self, state, budget, out, whole_prompt):
        self.tried.clear()
        left = super().admit_waiting(state, budget, out, whole_prompt)
        head = state.waiting[0] if state.waiting else None
        if head is None or left <= 0 or len(state.running) >= state.config.max_num_seqs \
                or any(req is head for req in self.tried):
            return left
        self.passed_over += 1
        remembered, state.refused = state.refused, None
        assert super().try_admit(state, head, left, out, whole_prompt) is None, f"{head} was admissible"
        state.refused = remembered
        return left


@st.composite
def crowded_v0(draw):
    """The harness's configs under vLLM V0's policy, often with the smallest legal KV cache (the head
    waits while others run, and preemptions), prefix caching on or off, sync or async scheduling."""
    config = draw(engine_configs(max_model_len=draw(st.sampled_from([160, 256]))))
    blocks = config.num_gpu_blocks
    if draw(st.booleans()):
        blocks = -(-config.max_model_len // config.block_size) + 1 + draw(st.integers(0, 4))
    return replace(config, policy="vllm-v0", num_gpu_blocks=blocks,
                   max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_model_len),
                   async_scheduling=draw(st.booleans()))


@given(scripted_specs(max_requests=10), crowded_v0())
def test_a_head_passed_over_would_be_refused(specs, config):
    engine = make_engine(config)
    engine.policy = CheckedV0()
    drive(engine, specs)


def test_remembered_refusals_change_no_record(monkeypatch):
    """An overloaded run with preemptions passes heads over (the check above holds throughout) and
    keeps the records of the run that tries every head."""
    config = EngineConfig(num_gpu_blocks=300, max_model_len=2048, max_num_batched_tokens=2048, max_num_seqs=32,
                          policy="vllm-v0", eos_token_id=EOS)
    workload = poisson_workload(rate=40.0, num_requests=150, lengths="conversation")
    policies = []

    def checked(name):
        policies.append(CheckedV0())
        return policies[-1]
    monkeypatch.setattr("sim.engine.engine.get_policy", checked)
    remembered = run_engine(workload, config, LinearCostModel(), seed=0)
    assert policies[0].passed_over > 50 and sum(remembered.requests.num_preemptions) > 0
    monkeypatch.setattr(CheckedV0, "refusals_repeat", False)
    tried = run_engine(workload, config, LinearCostModel(), seed=0)
    assert policies[1].passed_over == 0
    for table, reference in ((remembered.steps, tried.steps), (remembered.requests, tried.requests)):
        for name, column in reference.columns().items():
            assert repr(list(table.columns()[name])) == repr(list(column)), name  # (repr: NaN equals NaN)
