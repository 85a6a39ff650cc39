"""Every scheduling policy over random runs (issue 3): content never changes, each keeps its shape.

One driven run per example checks all properties at once (the runs dominate the cost): the
generic ones from the engine's log, the policy-specific ones inside `schedule` through a spy.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import POLICIES, Policy
from sim.core.config import EngineConfig
from kernels_cost_model.errors import ConfigError
from workloads.spec import RequestSpec
from tests.engine_harness import (EOS, assert_outputs_match_run_until_stop, drive, engine_configs,
                                  make_engine, scripted_specs)

WHOLE_PROMPT = ("orca", "vllm-v0", "static")


@st.composite
def policy_configs(draw, name: str):
    """The harness's configs under `name`, half of them with the smallest legal KV cache (so
    preemption is common); whole-prompt policies get a budget >= max_model_len."""
    config = draw(engine_configs(max_model_len=draw(st.sampled_from([160, 256]))))
    blocks = config.num_gpu_blocks
    if draw(st.booleans()):
        blocks = -(-config.max_model_len // config.block_size) + 1  # + vLLM's null block
    budget = config.max_num_batched_tokens
    if name in WHOLE_PROMPT:
        budget = max(budget, config.max_model_len)
    return replace(config, policy=name, max_num_batched_tokens=budget, num_gpu_blocks=blocks)


# ----- policy-specific shapes, checked on each plan as `schedule` returns it -----------------------
def never_chunks(running_before, out, state):
    """Every row catches up: decodes, and admitted prompts computed whole (after cache hits)."""
    for req, n in out.scheduled:
        assert req.num_computed_tokens + n == req.num_tokens, f"{req} chunked by {n}"


def prefill_or_decode(running_before, out, state):
    """vllm-v0: a step is only admissions (prefills) or only decodes."""
    admitted = {id(r) for r in out.admitted}
    if admitted:
        assert all(id(r) in admitted for r, _ in out.scheduled), "prefill step mixes in decodes"
    else:
        assert all(Policy.is_decode(r) for r, _ in out.scheduled), "decode step mixes in prefills"


def no_admission_mid_batch(running_before, out, state):
    """static: nobody joins while a batch is unfinished."""
    assert not (running_before and out.admitted), "admitted while a batch was running"


def decodes_first_within_budget(running_before, out, state):
    """sarathi: all running decodes, in rows before any prefill chunk; cut chunks fill the budget."""
    budget = state.config.max_num_batched_tokens
    admitted = {id(r) for r in out.admitted}
    is_decode = [id(r) not in admitted and Policy.is_decode(r) for r, _ in out.scheduled]
    assert is_decode == sorted(is_decode, reverse=True), "a decode row after a prefill row"
    scheduled = {id(r) for r, _ in out.scheduled}
    total = out.total_tokens
    missed = [r for r in state.running if Policy.is_decode(r) and id(r) not in scheduled]
    if missed:
        assert total == budget and all(is_decode), f"decodes {missed} left out with budget to spare"
    cut = [i for i, (r, n) in enumerate(out.scheduled) if r.num_computed_tokens + n < r.num_tokens]
    if cut and not out.preempted:
        assert cut == [len(out.scheduled) - 1] and total == budget, "chunk not cut to the budget"


SHAPES = {
    "vllm": [],
    "orca": [never_chunks],
    "vllm-v0": [never_chunks, prefill_or_decode],
    "static": [never_chunks, no_admission_mid_batch],
    "sarathi": [decodes_first_within_budget],
}


def spy_on(engine, checks) -> None:
    """Wrap the engine's policy so every plan is checked as it leaves `schedule`."""
    schedule = engine.policy.schedule

    def checked(state):
        running_before = list(state.running)
        out = schedule(state)
        for check in checks:
            check(running_before, out, state)
        return out

    engine.policy.schedule = checked


def test_every_policy_has_its_shape_checks():
    assert set(SHAPES) == set(POLICIES)


@pytest.mark.parametrize("name", sorted(POLICIES))
@given(data=st.data())
def test_policy_keeps_content_and_shape(name, data):
    """Outputs equal run_until_stop; catch-up rule every step; all finish and free their KV;
    invariants after every step (check_invariants=True); no preemption when KV holds every
    request whole; the policy's own shape every plan."""
    specs = data.draw(scripted_specs(), label="specs")
    config = data.draw(policy_configs(name), label="config")
    engine = make_engine(config)
    spy_on(engine, SHAPES[name])
    logs = drive(engine, specs)
    for log in logs:
        for _rid, computed, n, num_tokens, emitted in log.rows:
            assert computed + n <= num_tokens
            assert emitted == (1 if computed + n == num_tokens else 0)
    assert_outputs_match_run_until_stop(engine, specs)
    rec = engine.requests
    kv = engine.state.kv
    bs = config.block_size
    if sum(-(-(s.num_prompt_tokens + s.sampling_params.max_tokens) // bs) for s in specs) <= kv.num_usable_blocks:
        assert sum(rec.num_preemptions) == 0, "preempted with room for every request"
    assert kv.num_free_blocks == kv.num_usable_blocks
    assert not kv.req_blocks and not engine.state.running and not engine.state.waiting


@pytest.mark.parametrize("name", WHOLE_PROMPT)
def test_whole_prompt_policies_reject_a_budget_below_max_model_len(name):
    """Named when the engine is built, before any request (it once waited for the first step, outside
    the config's context, without the section in its name)."""
    config = EngineConfig(num_gpu_blocks=64, max_model_len=256, max_num_batched_tokens=255,
                          policy=name, eos_token_id=EOS)
    with pytest.raises(ConfigError, match="engine.max_num_batched_tokens=255"):
        make_engine(config)
    state = make_engine(replace(config, max_num_batched_tokens=256)).state
    state.config = config  # the policy checks its budget at every step too
    with pytest.raises(ConfigError, match="engine.max_num_batched_tokens=255"):
        POLICIES[name]().schedule(state)


def _prompt(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int32) + 10


def test_static_batch_runs_to_completion_before_the_next():
    config = EngineConfig(num_gpu_blocks=64, max_model_len=256, max_num_batched_tokens=256,
                          max_num_seqs=2, policy="static", eos_token_id=EOS, check_invariants=True)
    engine = make_engine(config)
    specs = [RequestSpec(0.0, _prompt(8), output_len=k, request_id=f"r{k}") for k in (2, 5, 1)]
    logs = drive(engine, specs)
    steps_of = {rid: [i for i, log in enumerate(logs) if any(r[0] == rid for r in log.rows)]
                for rid in ("r2", "r5", "r1")}
    assert steps_of["r2"] == [0, 1] and steps_of["r5"] == [0, 1, 2, 3, 4]
    assert steps_of["r1"] == [5]  # waits for the whole first batch


def test_sarathi_fills_the_budget_exactly_beside_a_decode():
    config = EngineConfig(num_gpu_blocks=64, max_model_len=256, max_num_batched_tokens=32,
                          long_prefill_token_threshold=8, policy="sarathi", eos_token_id=EOS,
                          enable_prefix_caching=False, check_invariants=True)
    engine = make_engine(config)
    specs = [RequestSpec(0.0, _prompt(20), output_len=10, request_id="a"),
             RequestSpec(0.0, _prompt(100) + 1, output_len=1, request_id="b")]
    logs = drive(engine, specs)
    assert [(r[0], r[2]) for r in logs[0].rows] == [("a", 20), ("b", 12)]
    assert [(r[0], r[2]) for r in logs[1].rows] == [("a", 1), ("b", 31)]
    assert [(r[0], r[2]) for r in logs[2].rows] == [("a", 1), ("b", 31)]
