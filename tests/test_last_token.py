"""Last-token planning and the hidden-states strategies (issue 9).

The plan made before a step must contain every request that stops in it and only promise stops
that happen; turning hidden states off must leave a run untouched; post-sampling prefill delays
exactly the requests that asked, hybrid extraction delays nobody.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.batch import BatchShape
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.engine.engine import Engine
from sim.whatif.last_token import (HiddenStatesCost, HybridExtraction, PostSamplingPrefill, plan_extraction,
                            wants_hidden_states)
from sim.whatif.last_token_whatif import compare_strategies
from sim.core.request import Request
from sim.core.sampling_params import SamplingParams
from sim.engine.simulation import run_engine
from sim.core.stop_rules import PROFILES, get_profile
from tests.engine_harness import EOS, drive, engine_configs
from workloads import make_rng, poisson_workload
from workloads.hidden_states import with_hidden_states
from workloads.spec import RequestSpec

# byte-range ids with text; 100 has none, 99 spans two characters (stop strings straddle tokens)
TOKEN_TEXT = {EOS: "\n", 7: "x", 97: "a", 98: "b", 99: "cd", 100: "", 101: "d"}
TOKENS = [EOS, 5, 7, 97, 98, 99, 100, 101]
STOPS = [(), (), ("ab",), ("d",), ("bcd", "x"), ("dd", "a")]


@st.composite
def specs_with_stops(draw, max_requests: int = 6, max_prompt: int = 40):
    """Scripted streams over TOKENS, every stop knob, some requests asking for hidden states.
    Prompts stay below the smallest max_model_len (the harness does not drive rejections)."""
    specs, t = [], 0.0
    for i in range(draw(st.integers(1, max_requests))):
        t += draw(st.sampled_from([0.0, 0.001, 0.01, 0.05]))
        prompt = np.arange(draw(st.integers(1, max_prompt)), dtype=np.int32) + 500 + 7 * i
        max_tokens = draw(st.integers(1, 30))
        params = SamplingParams(max_tokens=max_tokens,
                                min_tokens=draw(st.integers(0, min(max_tokens, 4))),
                                ignore_eos=draw(st.booleans()),
                                stop_token_ids=draw(st.sampled_from([(), (7,)])),
                                stop=draw(st.sampled_from(STOPS)),
                                include_stop_str_in_output=draw(st.booleans()))
        stream = tuple(draw(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=30)))
        specs.append(RequestSpec(t, prompt, output_token_ids=stream, sampling_params=params,
                                 request_id=f"r{i}", return_hidden_states=draw(st.booleans())))
    return specs


configs = st.tuples(st.sampled_from([48, 256]).flatmap(lambda m: engine_configs(max_model_len=m)),
                    st.sampled_from(sorted(PROFILES))).map(
    lambda cp: dataclasses.replace(cp[0], stop_profile=cp[1], stop_string_detection="engine"))
# (the plan is about the step a request stops in: stop strings found in the engine, not the front end)


def _engine(config: EngineConfig, hooks=()) -> Engine:
    return Engine(config, LinearCostModel(), config.num_gpu_blocks, token_text=TOKEN_TEXT, hooks=hooks)


def _done(engine: Engine) -> list[int]:
    """Indexes of requests that ran and finished (not rejected)."""
    rec = engine.requests
    return [i for i in range(len(rec)) if not rec.rejected[i]]


# ----- the plan --------------------------------------------------------------------------------
@given(specs_with_stops(), configs)
def test_plan_holds_every_stop_and_definite_last_always_stops(specs, config):
    hook = HybridExtraction(keep_plans=True)
    engine = _engine(config, [hook])
    drive(engine, specs)
    num_stops = 0
    for plan, stopped in hook.plans:
        definite, speculative = plan.ids("definite_last"), plan.ids("speculative")
        assert stopped <= definite | speculative
        assert definite <= stopped
        assert not definite & speculative
        for req in plan.speculative:
            p = req.sampling_params
            assert p.stop_token_ids or p.stop or not p.ignore_eos  # ignore_eos alone: never speculative
        num_stops += len(stopped)
    assert num_stops == len(_done(engine))


@pytest.mark.parametrize("profile, reason",
                         [("vllm", "stop"), ("vllm-v1-2025", "length"), ("vllm-v0", "stop")])
def test_eos_on_the_max_tokens_boundary_was_definite_last(profile, reason):
    spec = RequestSpec(0.0, np.arange(5) + 500, output_token_ids=(5, 5, EOS),
                       sampling_params=SamplingParams(max_tokens=3), request_id="r")
    hook = HybridExtraction(keep_plans=True)
    engine = _engine(EngineConfig(num_gpu_blocks=64, max_model_len=64, eos_token_id=EOS,
                                  stop_profile=profile), [hook])
    drive(engine, [spec])
    kinds = [("definite_last" if plan.ids("definite_last") else "speculative", bool(stopped))
             for plan, stopped in hook.plans]
    assert kinds == [("speculative", False), ("speculative", False), ("definite_last", True)]
    assert engine.requests.finish_reason[0] == reason


def _kinds(params: SamplingParams, profile: str, num_positions: int, prompt: int = 4,
           max_model_len: int | None = None) -> list[str]:
    """The plan's kind for a decode at each output position 1..num_positions."""
    out = []
    for position in range(1, num_positions + 1):
        req = Request("r", range(prompt), params, EOS)
        req.output_token_ids = [5] * (position - 1)
        req.num_computed_tokens = req.num_tokens - 1 if position > 1 else 0
        n = req.num_tokens - req.num_computed_tokens
        plan = plan_extraction([(req, n)], get_profile(profile), max_model_len)
        out.append(next(k for k in ("definite_last", "speculative", "none") if plan.ids(k)))
    return out


def test_stop_string_floor_is_the_profiles():
    params = SamplingParams(max_tokens=5, min_tokens=2, ignore_eos=True, stop="a")
    assert _kinds(params, "vllm", 5) == ["none", "none", "speculative", "speculative", "definite_last"]
    assert _kinds(params, "vllm-v0", 5) == ["none", "speculative", "speculative", "speculative",
                                            "definite_last"]
    ids = SamplingParams(max_tokens=5, min_tokens=2, ignore_eos=True, stop_token_ids=[9])
    assert _kinds(ids, "vllm", 3) == ["none", "none", "speculative"]
    length_only = SamplingParams(max_tokens=4, ignore_eos=True)
    assert _kinds(length_only, "vllm", 4) == ["none", "none", "none", "definite_last"]
    assert _kinds(length_only, "vllm", 4, prompt=10, max_model_len=12) == ["none", "definite_last",
                                                                         "definite_last", "definite_last"]


def test_mid_prefill_chunks_are_not_planned():
    req = Request("r", range(10), SamplingParams(), EOS)
    plan = plan_extraction([(req, 4)], get_profile("vllm"), None)
    assert plan.definite_last == plan.speculative == plan.none == ()


# ----- turning it off --------------------------------------------------------------------------
def _columns(engine_or_records) -> dict:
    req, steps = engine_or_records.requests, engine_or_records.steps
    cols = {f"req.{k}": v for k, v in req.columns().items()}
    cols["req.token_times"] = [None if t is None else list(t) for t in req.token_times]
    cols.update({f"step.{k}": v for k, v in steps.columns().items()})
    return cols


def _assert_same(a, b) -> None:
    ca, cb = _columns(a), _columns(b)
    assert ca.keys() == cb.keys()
    for name in ca:
        x, y = ca[name], cb[name]
        assert len(x) == len(y), name
        for u, v in zip(x, y):
            both_nan = isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v)
            assert u == v or both_nan, (name, u, v)


@given(specs_with_stops(), configs, st.sampled_from(["hybrid", "prefill"]))
def test_hidden_states_off_changes_nothing(specs, config, strategy):
    nobody = [dataclasses.replace(s, return_hidden_states=False) for s in specs]
    plain = _engine(config)
    drive(plain, nobody)
    flagged = _engine(config)  # requests ask, no strategy installed: the flag is inert
    drive(flagged, specs)
    hook = HybridExtraction() if strategy == "hybrid" else PostSamplingPrefill()
    hooked = _engine(config, [hook])  # strategy installed, nobody asks
    drive(hooked, nobody)
    _assert_same(plain, flagged)
    _assert_same(plain, hooked)


def test_fraction_zero_workload_is_the_plain_workload():
    workload = poisson_workload(rate=20, num_requests=60, lengths="sharegpt", ignore_eos=False,
                                max_tokens=300)
    config = EngineConfig(num_gpu_blocks=4000, max_model_len=8192, max_num_batched_tokens=2048)
    cm = LinearCostModel()
    plain = run_engine(workload, config, cm, seed=3)
    _assert_same(plain, run_engine(with_hidden_states(workload, 0.0), config, cm, seed=3))
    _assert_same(plain, run_engine(with_hidden_states(workload, 1.0), config, cm, seed=3))
    _assert_same(plain, run_engine(with_hidden_states(workload, 0.0), config, cm, seed=3,
                                   hooks=[PostSamplingPrefill()]))
    specs = list(workload.iter_requests(make_rng(3, "workload")))
    half = list(with_hidden_states(workload, 0.5).iter_requests(make_rng(3, "workload")))
    assert 0 < sum(s.return_hidden_states for s in half) < len(half)
    assert [s.request_id for s in half] == [s.request_id for s in specs]
    assert all(np.array_equal(a.prompt_token_ids, b.prompt_token_ids) for a, b in zip(half, specs))
    more = list(with_hidden_states(workload, 0.8).iter_requests(make_rng(3, "workload")))
    assert all(b.return_hidden_states for a, b in zip(half, more) if a.return_hidden_states)


# ----- what each strategy changes ------------------------------------------------------------
@given(specs_with_stops(), configs)
def test_post_sampling_prefill_delays_exactly_the_requests_that_asked(specs, config):
    hook = PostSamplingPrefill()
    engine = _engine(config, [hook])
    logs = drive(engine, specs)
    ends = [log.end for log in logs]
    rec, asked = engine.requests, {s.request_id for s in specs if s.return_hidden_states}
    for i in _done(engine):
        last, finish = rec.token_times[i][-1], rec.finish_time[i]
        if rec.request_id[i] in asked:
            assert finish == ends[ends.index(last) + 1]  # the end of the next step
        else:
            assert finish == last
    assert sorted(hook.stats.asked) == [i for i in _done(engine) if rec.request_id[i] in asked]
    scheduled = sum(n for log in logs for _rid, _c, n, _t, _e in log.rows)
    recorded = sum(engine.steps.num_prefill_tokens) + sum(engine.steps.num_decode_tokens)
    assert recorded - scheduled == hook.stats.prefill_tokens


@given(specs_with_stops(), configs)
def test_hybrid_never_delays_a_completion_only_lengthens_steps(specs, config):
    cost = HiddenStatesCost(hidden_size=1024, dtype_bytes=2, d2h_bytes_per_s=1e9, fixed_s=1e-4)
    hook = HybridExtraction(cost, keep_plans=True)
    engine = _engine(config, [hook])
    logs = drive(engine, specs)
    rec, cm = engine.requests, LinearCostModel()
    for i in _done(engine):
        assert rec.finish_time[i] == rec.token_times[i][-1]
    assert len(hook.plans) == len(logs) == len(engine.steps)
    for log, (plan, _), duration in zip(logs, hook.plans, engine.steps.duration):
        new = [n for _rid, _c, n, _t, _e in log.rows]
        context = [c for _rid, c, _n, _t, _e in log.rows]
        sampled = sum(c + n == t for _rid, c, n, t, _e in log.rows)
        rows = sum(wants_hidden_states(r) for r in plan.extracted)
        extraction = cost.resolve(cm).extraction_s(rows)
        assert duration == cm.step_time(BatchShape(new, context, sampled)) + extraction


@given(specs_with_stops(), configs)
def test_free_hybrid_extraction_is_the_plain_run(specs, config):
    free = HiddenStatesCost(fixed_s=0.0, d2h_bytes_per_s=1e300)
    plain = _engine(config)
    drive(plain, specs)
    hooked = _engine(config, [HybridExtraction(free)])
    drive(hooked, specs)
    _assert_same(plain, hooked)


def test_compare_strategies_length_bound_has_no_speculation():
    workload = with_hidden_states(poisson_workload(rate=4, num_requests=40, lengths="sharegpt",
                                                   max_tokens=64, ignore_eos=True), 0.5)
    config = EngineConfig(num_gpu_blocks=4000, max_model_len=8192, async_scheduling=False)
    cmp = compare_strategies(workload, config, LinearCostModel(), seed=1)
    hybrid, prefill = cmp.results["hybrid"], cmp.results["post_sampling_prefill"]
    assert hybrid.stats.speculative_rows == 0 and hybrid.stats.wasted_rows == 0
    assert hybrid.stats.rows == len(hybrid.stats.asked) == len(prefill.stats.asked) > 0
    assert prefill.asked_mean_e2e_delta_s > 0 and prefill.stats.prefill_tokens > 0
    assert hybrid.peak_extra_mib > 0 and prefill.peak_extra_mib > hybrid.peak_extra_mib
    assert set(cmp.table().index) == {"hybrid", "post_sampling_prefill"}


@given(specs_with_stops(), configs)
def test_async_plans_hold_every_stop_in_the_real_loop(specs, config):
    """Under async scheduling (step N+1 planned before step N's tokens are known: `run_engine`'s loop, not
    `drive`) each step's plan, taken at its own end, holds every stop; a definite_last row stops unless
    the step before stopped its request (wasted); the wasted count is exactly the extracted rows whose
    request did not stop in that step."""
    config = dataclasses.replace(config, async_scheduling=True)
    hook = HybridExtraction(keep_plans=True)
    records = run_engine(sorted(specs, key=lambda s: s.arrival_time_s), config, LinearCostModel(),
                         token_text=TOKEN_TEXT, hooks=[hook])
    finished_before, wasted, stops = set(), 0, 0
    for plan, stopped in hook.plans:
        definite, speculative = plan.ids("definite_last"), plan.ids("speculative")
        assert stopped <= definite | speculative
        assert definite <= stopped | finished_before
        asked = {r.request_id for r in plan.extracted if wants_hidden_states(r)}
        wasted += len(asked - stopped)
        finished_before |= stopped
        stops += len(stopped)
    assert hook.stats.wasted_rows == wasted
    assert stops == sum(1 for rejected in records.requests.rejected if not rejected)


def test_async_hybrid_extracts_the_length_bound_last_tokens():
    """A default (async) run of length-bound requests copies exactly one row per request that asked, the
    definite last one, and wastes none."""
    workload = with_hidden_states(poisson_workload(rate=4, num_requests=40, lengths="sharegpt",
                                                   max_tokens=64, ignore_eos=True), 0.5)
    config = EngineConfig(num_gpu_blocks=4000, max_model_len=8192, async_scheduling=True)
    cmp = compare_strategies(workload, config, LinearCostModel(), seed=1)
    stats = cmp.results["hybrid"].stats
    assert stats.rows == stats.definite_rows == len(stats.asked) > 0
    assert stats.wasted_rows == 0 and stats.speculative_rows == 0


def test_compare_strategies_names_a_whole_simulation_config_instead_of_a_type_error():
    """A reader of docs/last_token.md who passes the SimulationConfig they have gets a named error."""
    from sim import ConfigError, SimulationConfig
    workload = poisson_workload(4.0, 5, "sharegpt")
    with pytest.raises(ConfigError, match=r"^config='SimulationConfig': must be an EngineConfig"):
        compare_strategies(with_hidden_states(workload, 0.25), SimulationConfig(), LinearCostModel(), 1000)
