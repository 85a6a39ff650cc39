"""Speculative decoding on a hybrid model (sim.core.kv_groups with sim.engine.spec_decode) against traces
recorded from vLLM's own V1 Scheduler and KV cache coordinator.

tests/data/vllm_conformance/vllm-<version>-hybrid-spec.jsonl.gz holds, per pinned release, 300 random
scenarios (`python benchmarks/vllm_conformance.py record --hybrid --spec`): EAGLE with 1 to 4 drafts on a
full-attention group with one sliding-window group (gpt-oss), two of one window (Gemma-3) or a state group
(Qwen3-Next); small windows, tight block pools, shared prefixes. Chunked local attention is left out: vLLM
turns its hybrid KV manager off for it under EAGLE. Replaying them needs no vLLM.
"""
from __future__ import annotations

import dataclasses

import pytest

from sim.core.kv_groups import HybridKVCacheManager
from sim.core.scheduler_profiles import PROFILES
from sim.core.stop_rules import RELEASE_STOP_PROFILES
from sim.fidelity.conformance.compare import first_difference
from sim.fidelity.conformance.servesim_trace import run_servesim
from tests.test_vllm_conformance import VERSIONS, assert_recorded_seeds_agree, recorded, replay

#: seeds whose recorded trace each release behaviour changes (replaying them with the profile field
#: flipped departs from both releases' recordings): kept in the CI subset too
PINNED = {"eagle_drops_last_hit_block": ["seed 28", "seed 36"],
          "eagle_hashes_next_token": ["seed 41", "seed 76"],
          "window_admission_cap": ["seed 14"],
          "windows_free_processed_only": ["seed 23", "seed 29"]}
#: state-group seeds that need the k speculative state blocks per request
STATE_BLOCKS = ["seed 2", "seed 7", "seed 16"]


def names(version: str) -> list[str]:
    _, cases = recorded(f"{version}-hybrid-spec")
    return [name for name in cases if name.startswith("seed ")]


@pytest.mark.parametrize("version", VERSIONS)
def test_hybrid_spec_scenarios_agree_step_for_step(version):
    pinned = [s for seeds in PINNED.values() for s in seeds] + STATE_BLOCKS
    assert_recorded_seeds_agree(f"{version}-hybrid-spec", 300, pinned)


def test_recordings_cover_layouts_drafts_hits_and_preemption():
    """Each layout vLLM runs with its hybrid manager under EAGLE, rows verifying drafts, prefix hits and
    preemptions all occur in the recordings."""
    _, cases = recorded("0.33.0-hybrid-spec")
    layouts = {tuple(g["kind"] for g in case["scenario"]["config"]["kv_groups"]) for case in cases.values()}
    assert layouts == {("full", "sliding"), ("full", "sliding", "sliding"), ("full", "linear")}
    steps = [step for case in cases.values() for step in case["trace"]["steps"]]
    assert any(step["preempted"] for step in steps)
    assert any(hit for step in steps for hit in step["admitted"].values())
    drafted = [case for case in cases.values() if any(
        n == 1 + case["scenario"]["speculative"]["num_speculative_tokens"] > 1
        for step in case["trace"]["steps"] for n in step["tokens"].values())]
    assert len(drafted) > len(cases) // 2


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("field", sorted(PINNED))
def test_release_behaviours_are_pinned(version, field, monkeypatch):
    """Each release's EAGLE hit rule (0.19 drops the last hit block, in a sliding group after asking for
    one more; 0.33 keys blocks with the next token), the window admission cap and window release behind
    processed tokens only: with the field flipped, servesim departs from the release's recorded traces."""
    name, cases = recorded(f"{version}-hybrid-spec")
    flipped = name + "-flipped"
    base = PROFILES[name]
    monkeypatch.setitem(PROFILES, flipped, dataclasses.replace(base, name=flipped, **{field: not getattr(base, field)}))
    for seed in PINNED[field]:
        case = cases[seed]
        assert first_difference(case["trace"], run_servesim(case["scenario"], name)) is None
        other = run_servesim(case["scenario"], flipped, stop_profile=RELEASE_STOP_PROFILES[name])
        assert first_difference(case["trace"], other) is not None, seed


@pytest.mark.parametrize("version", VERSIONS)
def test_state_groups_hold_speculative_state_blocks(version, monkeypatch):
    """vLLM gives a state group k more blocks per request under speculative decoding; without them
    servesim admits too much."""
    monkeypatch.setattr(HybridKVCacheManager, "add_speculative_state", lambda self, k: None)
    for seed in STATE_BLOCKS:
        assert first_difference(*replay(f"{version}-hybrid-spec", seed)) is not None, seed
