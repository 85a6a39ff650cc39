"""Drives the pure-core Engine step by step (no SimPy) and logs what each step did."""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.engine.engine import Engine
from sim.core.sampling_params import SamplingParams
from workloads.spec import RequestSpec

EOS = 2


@dataclass
class StepLog:
    """Per step: (request id, computed before, new tokens, num_tokens before, sampled?)."""

    rows: list = field(default_factory=list)
    end: float = 0.0


def drive(engine: Engine, specs: list[RequestSpec], max_steps: int = 200_000) -> list[StepLog]:
    """Feed arrivals at their times and run steps until every request finished."""
    logs, now, pending = [], 0.0, sorted(specs, key=lambda s: s.arrival_time_s)
    while pending or engine.has_work:
        while pending and pending[0].arrival_time_s <= now:
            engine.add_request(pending.pop(0), now)
        step = engine.plan_step(now) if engine.has_work else None
        if step is None:
            assert pending, "engine has work it cannot schedule"
            now = pending[0].arrival_time_s
            continue
        # plan_step already counts the step's tokens as computed (vLLM advances at schedule time)
        before = [(r.request_id, r.num_computed_tokens - n, n, r.num_tokens, len(r.output_token_ids))
                  for r, n in step.plan.scheduled]
        reqs = [r for r, _ in step.plan.scheduled]
        now += step.duration
        engine.finish_step(step, now)
        log = StepLog(end=now)
        for (rid, computed, n, num_tokens, out_before), req in zip(before, reqs):
            log.rows.append((rid, computed, n, num_tokens, len(req.output_token_ids) - out_before))
        logs.append(log)
        assert len(logs) < max_steps, "runaway simulation"
    return logs


@st.composite
def scripted_specs(draw, max_requests: int = 8, max_prompt: int = 120):
    """Requests with random prompts, arrival times and scripted output streams."""
    n = draw(st.integers(1, max_requests))
    specs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.001, 0.01, 0.05]))
        prompt_len = draw(st.integers(1, max_prompt))
        prefix = draw(st.sampled_from([0, 0, 16, 32]))
        prompt = np.concatenate([np.arange(prefix, dtype=np.int32) + 500,
                                 np.asarray(draw(st.lists(st.integers(3, 40), min_size=prompt_len,
                                                          max_size=prompt_len)), dtype=np.int32)])
        stream = draw(st.lists(st.integers(2, 12), min_size=1, max_size=40))
        params = SamplingParams(max_tokens=draw(st.integers(1, 40)),
                                ignore_eos=draw(st.booleans()),
                                stop_token_ids=draw(st.sampled_from([(), (7,)])))
        specs.append(RequestSpec(t, prompt, output_token_ids=tuple(stream), sampling_params=params,
                                 request_id=f"r{i}"))
    return specs


def for_policy(config, policy: str, **changes):
    """`config` under `policy` (and `changes`), its budget raised to hold the longest prompt where
    the policy schedules whole prompts (every policy but vLLM V1's and Sarathi's chunking)."""
    config = dataclasses.replace(config, policy=policy, **changes)
    if policy in ("vllm", "sarathi"):
        return config
    return dataclasses.replace(config, max_num_batched_tokens=max(config.max_num_batched_tokens,
                                                                  config.max_model_len))


@st.composite
def engine_configs(draw, max_model_len: int = 256):
    """Random budgets, thresholds, block sizes and KV sizes (from minimal to roomy)."""
    block_size = draw(st.sampled_from([1, 4, 16]))
    min_blocks = -(-max_model_len // block_size) + 1  # one max_model_len request + vLLM's null block
    chunked = draw(st.booleans())
    budget = draw(st.integers(1, 600)) if chunked else draw(st.integers(max_model_len, 800))
    return EngineConfig(
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(min_blocks, 3 * min_blocks)),
        max_model_len=max_model_len,
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 8, 50])),
        enable_prefix_caching=draw(st.booleans()),
        scheduling=draw(st.sampled_from(["fcfs", "priority"])),
        eos_token_id=EOS,
        check_invariants=True,
    )


def make_engine(config: EngineConfig) -> Engine:
    return Engine(config, LinearCostModel(), config.num_gpu_blocks)


def assert_outputs_match_run_until_stop(engine: Engine, specs: list[RequestSpec]) -> None:
    """Every request's finish reason, stop reason and output count equal run_until_stop on its stream."""
    from sim.core.replay import run_until_stop
    from workloads.token_streams import TokenSource

    source, rec = TokenSource(EOS), engine.requests
    by_id = {s.request_id: s for s in specs}
    for i, rid in enumerate(rec.request_id):
        spec = by_id[rid]
        stream = [source.token_at(spec, i, p) for p in range(400)]
        expected = run_until_stop(stream, EOS, spec.sampling_params, prompt_len=spec.num_prompt_tokens,
                                  max_model_len=engine.config.max_model_len, token_text={})
        assert (rec.finish_reason[i], rec.stop_reason[i]) == (expected.finish_reason, expected.stop_reason)
        assert rec.num_output_tokens[i] == len(expected.output_token_ids)


def padded_budget(config: EngineConfig, k: int) -> EngineConfig:
    """`config` with a budget that holds a 1 + k decode row: vLLM 0.33 pads a one-token admission to one
    under speculative decoding (`SpecDecoder` names a smaller budget)."""
    return dataclasses.replace(config, max_num_batched_tokens=max(config.max_num_batched_tokens, 1 + k))
