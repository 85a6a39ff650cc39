"""servesim's Mamba "align" mode (sim.core.kv_mamba_align, policies.mamba_align) against traces recorded
from vLLM 0.33's own V1 Scheduler and KV cache coordinator.

tests/data/vllm_conformance/vllm-0.33.0-hybrid-align.jsonl.gz holds 300 random scenarios of a state
model (a full-attention group beside a linear-attention one) with prefix caching and chunked prefill on,
which vLLM runs in `mamba_cache_mode="align"` (`python benchmarks/vllm_conformance.py record --hybrid
--align`): shared prefixes, tight block pools, async scheduling half the time. Replaying them needs no vLLM.
"""
from __future__ import annotations

import dataclasses

import pytest

from sim.core import kv_mamba_align
from sim.core.scheduler_profiles import PROFILES
from sim.fidelity.conformance.compare import first_difference
from sim.fidelity.conformance.servesim_trace import run_servesim
from tests.test_vllm_conformance import assert_recorded_seeds_agree, recorded

RECORDING = "0.33.0-hybrid-align"
#: seeds whose trace a rule of align mode changes (with the rule left out, servesim departs from them)
PINNED = {"shared_prefix_boundary": ["seed 8", "seed 10"], "hit_cached_this_step": ["seed 20", "seed 45"]}


def test_align_scenarios_agree_step_for_step():
    assert_recorded_seeds_agree(RECORDING, 300, [s for pinned in PINNED.values() for s in pinned])


def test_recordings_cover_hits_preemption_and_async():
    _, cases = recorded(RECORDING)
    steps = [step for case in cases.values() for step in case["trace"]["steps"]]
    assert any(step["preempted"] for step in steps)
    assert sum(any(hit for step in case["trace"]["steps"] for hit in step["admitted"].values())
               for case in cases.values()) >= 100
    assert {case["scenario"]["config"]["async_scheduling"] for case in cases.values()} == {True, False}


def test_mode_none_departs_from_the_recordings(monkeypatch):
    """With `mamba_align` off (no state hits, chunks unaligned) almost no scenario agrees."""
    monkeypatch.setitem(PROFILES, "off", dataclasses.replace(PROFILES["vllm-0.33"], name="off", mamba_align=False))
    _, cases = recorded(RECORDING)
    agree = sum(first_difference(case["trace"], run_servesim(case["scenario"], "off", stop_profile="vllm")) is None
                for case in list(cases.values())[:50])
    assert agree <= 2


@pytest.mark.parametrize("rule", sorted(PINNED))
def test_each_rule_is_pinned(rule, monkeypatch):
    """The chunk stop at the full-attention hit's end and the deferral of a hit on a state cached in the
    same step are vLLM's: without either, servesim departs from the pinned seeds."""
    manager = kv_mamba_align.MambaAlignKVCacheManager
    if rule == "shared_prefix_boundary":
        monkeypatch.setattr(manager, "shared_prefix_boundary", lambda self, req: 0)
    else:
        monkeypatch.setattr(manager, "_hit_too_new", lambda self, cached_blocks: False)
    _, cases = recorded(RECORDING)
    for seed in PINNED[rule]:
        case = cases[seed]
        assert first_difference(case["trace"], run_servesim(case["scenario"], "vllm-0.33")) is not None, seed


def test_speculative_decoding_with_align_falls_back_to_mode_none_and_says_so():
    """Align mode under speculative decoding is not modelled: the run takes mode "none" (the plain hybrid
    manager, 1 + k states, no state hits, chunks not clipped) with a warning, not a silent mode."""
    from kernels_cost_model.kv_layout import KVCacheGroupSpec
    from kernels_cost_model.model_shapes import FULL, LINEAR
    from sim.core.kv_groups import HybridKVCacheManager
    kv = kv_mamba_align.MambaAlignKVCacheManager(20, 4, True, (KVCacheGroupSpec(FULL, 1),
                                                                KVCacheGroupSpec(LINEAR, 1, state_blocks=1)))
    with pytest.warns(UserWarning, match="align.*speculative decoding"):
        kv.add_speculative_state(2)
    assert type(kv) is HybridKVCacheManager and kv.no_state_hits and not kv.checkpoint_tokens
    assert kv.groups[1].state_blocks == 3
