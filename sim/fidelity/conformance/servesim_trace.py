"""Run a conformance scenario through servesim's engine (its SimPy processes, as `simulate` does) and
record what each step scheduled.

A trace is plain data, the same shape `vllm_trace` records from vLLM:

    {"steps": [{"tokens": {"r0": 31}, "admitted": {"r0": 0}, "preempted": []}, ...],
     "finished": {"r0": ["stop", 5], ...}, "stop_reasons": {"r0": "cd", ...}}

`tokens`: new tokens per request; `admitted`: computed tokens (prefix-cache hits) of each request that
left the waiting queue; `preempted`: who was preempted; `finished`: each request's finish reason and the
output tokens its client received ("rejected" for a prompt refused before the engine); `stop_reasons`: the
stop reason of each request whose client saw "stop" (a stop string, a stop token id, None for EOS; traces
recorded before it was added lack it).
"""
from __future__ import annotations

from kernels_cost_model.kv_layout import KVCacheGroupSpec
from kernels_cost_model.model_shapes import CHUNKED, FULL, LINEAR, SLIDING
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.hooks import EngineHook
from sim.core.sampling_params import SamplingParams
from sim.core.stop_rules import RELEASE_STOP_PROFILES
from sim.engine.simulation import run_engine
from sim.core.speculative import SpeculativeConfig
from sim.engine.spec_decode import SpecDecoder
from sim.fidelity.conformance.scenario import EOS_TOKEN_ID, STEP_S, make_scenario_acceptance, token_text
from workloads.spec import RequestSpec

CONFIG_FIELDS = ("block_size", "num_gpu_blocks", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                 "enable_chunked_prefill", "long_prefill_token_threshold", "enable_prefix_caching",
                 "scheduling", "async_scheduling")


class StepRecorder(EngineHook):
    """Records every planned step's schedule, admissions and preemptions."""

    def __init__(self):
        self.steps: list[dict] = []

    def on_plan(self, engine, step) -> None:
        plan = step.plan
        tokens = {req.request_id: n for req, n in plan.scheduled}
        admitted = {req.request_id: req.num_computed_tokens for req in plan.admitted}  # before the step
        self.steps.append({"tokens": tokens, "admitted": admitted,
                           "preempted": sorted(r.request_id for r in plan.preempted)})


def engine_config(scenario: dict, scheduler_profile: str, **engine) -> EngineConfig:
    """The scenario's engine under `scheduler_profile` and its release's stop profile."""
    config = {name: scenario["config"][name] for name in CONFIG_FIELDS}
    engine.setdefault("stop_profile", RELEASE_STOP_PROFILES.get(scheduler_profile, "vllm"))
    return EngineConfig(**config, scheduler_profile=scheduler_profile, eos_token_id=EOS_TOKEN_ID,
                        check_invariants=True, **engine)


def request_specs(scenario: dict) -> list[RequestSpec]:
    return [RequestSpec(r["arrival"], r["prompt"], output_token_ids=tuple(r["output"]),
                        request_id=r["id"], priority=r["priority"], abort_time_s=r["abort"],
                        sampling_params=SamplingParams(max_tokens=r["max_tokens"], ignore_eos=r["ignore_eos"],
                                                       stop_token_ids=tuple(r["stop_token_ids"]),
                                                       min_tokens=r.get("min_tokens", 0),
                                                       stop=tuple(r.get("stop", ()))))
            for r in scenario["requests"]]


_KINDS = {"full": FULL, "sliding": SLIDING, "chunked": CHUNKED, "linear": LINEAR}


def kv_groups(scenario: dict) -> tuple[KVCacheGroupSpec, ...] | None:
    """The scenario's KV layer groups as servesim's specs (a linear group's state: one block), or None."""
    groups = scenario["config"].get("kv_groups")
    if not groups:
        return None
    return tuple(KVCacheGroupSpec(_KINDS[g["kind"]], 1, window=g.get("window", 0),
                                  state_blocks=1 if g["kind"] == "linear" else 0) for g in groups)


def spec_hooks(scenario: dict) -> list:
    """[the spec decoder] of a spec-decoding scenario (no proposer cost: every step lasts STEP_S), else []."""
    spec = scenario.get("speculative")
    if spec is None:
        return []
    config = SpeculativeConfig(spec["method"], num_speculative_tokens=spec["num_speculative_tokens"])
    return [SpecDecoder(config, make_scenario_acceptance(spec))]


def run_servesim(scenario: dict, scheduler_profile: str = "vllm", **engine) -> dict:
    """The trace of `scenario` under servesim with `scheduler_profile` (every step lasts STEP_S);
    `engine`: other EngineConfig settings (e.g. stop_string_detection="engine"). A speculative-decoding
    scenario finds stop strings in the front end, as vLLM does, unless `engine` says otherwise."""
    if scenario.get("speculative") is not None:
        engine.setdefault("stop_string_detection", "frontend")
    config = engine_config(scenario, scheduler_profile, **engine)
    recorder = StepRecorder()
    cost = LinearCostModel(fixed_s=STEP_S, per_new_token_s=0.0, per_context_token_s=0.0, per_sampled_s=0.0)
    hooks = [recorder] + spec_hooks(scenario)
    records = run_engine(request_specs(scenario), config, cost, hooks=hooks, token_text=token_text,
                         kv_groups=kv_groups(scenario))
    req = records.requests
    finished, stop_reasons = {}, {}
    for i, rid in enumerate(req.request_id):
        reason = "rejected" if req.rejected[i] else req.finish_reason[i]
        finished[rid] = [reason, 0 if req.rejected[i] else int(req.num_output_tokens[i])]
        if reason == "stop":
            why = req.stop_reason[i]
            stop_reasons[rid] = why if why is None or isinstance(why, str) else int(why)
    return {"steps": recorder.steps, "finished": dict(sorted(finished.items())),
            "stop_reasons": dict(sorted(stop_reasons.items()))}
