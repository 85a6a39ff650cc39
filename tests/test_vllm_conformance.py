"""servesim's scheduler profiles against traces recorded from vLLM's own V1 Scheduler (issue 20).

tests/data/vllm_conformance/vllm-<version>.jsonl.gz holds, per pinned vLLM release, hand-made scenarios
for each difference found (issue 20 and since) plus 1,000 random ones, with the per-step schedule vLLM
produced (`python benchmarks/vllm_conformance.py record`); vllm-<version>-stop.jsonl.gz the same for the
stop rules (`record --stop-rules`: min_tokens, max_tokens unset, stop strings found by vLLM's detokenizer in
the front end); -spec.jsonl.gz for speculative decoding (`record --spec`) and -spec-stop.jsonl.gz for the
stop rules under it (`record --spec --stop-rules`). Replaying them needs no vLLM. A live comparison runs
when vLLM is importable (slow).
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import pytest

from sim.fidelity.conformance.compare import first_difference
from sim.fidelity.conformance.recorded import profile_for_version, read_recorded
from sim.fidelity.conformance.scenario import random_scenario
from sim.fidelity.conformance.servesim_trace import run_servesim

DATA = Path(__file__).parent / "data" / "vllm_conformance"
VERSIONS = ("0.33.0", "0.19.1")
RANDOM_IN_CI = 100  # of the 1,000 random scenarios per version; all of them run without CI=true


@lru_cache(maxsize=None)
def recorded(version: str) -> tuple[str, dict]:
    """`version` is "0.33.0", or "0.33.0-stop" for the stop-rule recordings."""
    vllm_version, cases = read_recorded(DATA / f"vllm-{version}.jsonl.gz")
    return profile_for_version(vllm_version), {case["name"]: case for case in cases}


def replay(version: str, name: str, profile: str | None = None, **engine) -> tuple[dict, dict]:
    """(vLLM's recorded trace, servesim's trace) of one recorded case."""
    default, cases = recorded(version)
    case = cases[name]
    return case["trace"], run_servesim(case["scenario"], profile or default, **engine)


def assert_same(version: str, name: str) -> dict:
    want, got = replay(version, name)
    assert first_difference(want, got) is None, first_difference(want, got)
    return want


def assert_recorded_seeds_agree(recording: str, at_least: int, pinned=()) -> None:
    """Every random scenario of `recording` (e.g. "0.33.0-spec") replays step for step; under CI the first
    RANDOM_IN_CI of them and the `pinned` seeds."""
    _, cases = recorded(recording)
    names = [name for name in cases if name.startswith("seed ")]
    assert len(names) >= at_least
    if os.environ.get("CI"):
        names = names[:RANDOM_IN_CI] + [name for name in pinned if name not in names[:RANDOM_IN_CI]]
    failures = [(name, diff) for name in names if (diff := first_difference(*replay(recording, name)))]
    assert not failures, failures[:3]


@pytest.mark.parametrize("version", VERSIONS + tuple(f"{v}-stop" for v in VERSIONS))
def test_random_scenarios_agree_step_for_step(version):
    assert_recorded_seeds_agree(version, 1000)


#: 0.33 seeds whose preempted request hits blocks cached as its verified tokens were appended
#: (update_from_output, before the preemption): kept in the CI subset too.
SPEC_CACHED_AFTER_VERIFY = ["seed 156", "seed 160", "seed 163", "seed 193"]


@pytest.mark.parametrize("version", VERSIONS)
def test_spec_decoding_scenarios_agree_step_for_step(version):
    """EAGLE with k drafts and a shared acceptance pattern (vllm_conformance.py record --spec)."""
    assert_recorded_seeds_agree(f"{version}-spec", 300, SPEC_CACHED_AFTER_VERIFY)


@pytest.mark.parametrize("version", VERSIONS)
def test_spec_decoding_with_stop_strings_agrees_step_for_step(version):
    """The stop-rule requests under EAGLE (vllm_conformance.py record --spec --stop-rules): stop strings
    often complete inside a step that verifies several tokens; finishes, counts and stop reasons too."""
    assert_recorded_seeds_agree(f"{version}-spec-stop", 300)


#: (name, the client's output tokens under 0.19.1 and 0.33.0, stop reason under each)
STOP_IN_STEP = [("stop_string_mid_step", 5, 4, "cd", "cd"), ("stop_string_mid_step_async", 5, 4, "cd", "cd"),
                ("stop_string_then_eos_in_step", 5, 4, "cd", "cd"),
                ("stop_strings_list_order_in_step", 5, 3, "f", "ab"),
                ("stop_string_past_min_tokens_in_step", 5, 4, "cd", "cd")]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name, kept_019, kept_033, reason_019, reason_033", STOP_IN_STEP)
def test_stop_string_inside_a_multi_token_step(version, name, kept_019, kept_033, reason_019, reason_033):
    """A stop string completed before the last token a step verified: vLLM 0.19.1's front end keeps the
    step's later tokens and takes stop strings in list order over the step's text; 0.33.0 drops them."""
    want = assert_same(f"{version}-spec-stop", name)
    old = version == "0.19.1"
    assert want["finished"]["r0"] == ["stop", kept_019 if old else kept_033]
    assert want["stop_reasons"]["r0"] == (reason_019 if old else reason_033)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("async_", [False, True])
def test_stop_string_found_in_the_front_end(version, async_):
    """6: the client sees 'cd' end r0 on its 4th token; the engine schedules r0 again until the front
    end's abort lands (once, twice under async scheduling), and r1 waits for r0's seat meanwhile."""
    name = "stop_string_frontend" + ("_async" if async_ else "")
    want = assert_same(f"{version}-stop", name)
    assert want["finished"]["r0"] == ["stop", 4]
    r0 = [i for i, s in enumerate(want["steps"]) if "r0" in s["tokens"]]
    assert len(r0) == 4 + (2 if async_ else 1)
    assert min(i for i, s in enumerate(want["steps"]) if "r1" in s["admitted"]) > r0[-1]
    engine_mode = replay(f"{version}-stop", name, stop_string_detection="engine")[1]
    assert first_difference(want, engine_mode) is not None


@pytest.mark.parametrize("version", VERSIONS)
def test_stop_string_on_a_length_capped_token_ends_in_the_engine(version):
    """6: the engine ended the request by length on that token; no abort and no extra step."""
    want = assert_same(f"{version}-stop", "stop_string_on_the_last_token")
    assert want["finished"]["r0"] == ["stop", 3] and len(want["steps"]) == 3


@pytest.mark.parametrize("version", VERSIONS)
def test_max_tokens_unset_runs_to_max_model_len(version):
    """9: max_tokens=None: a 58-token prompt under max_model_len 64 gets 6 tokens, "length"."""
    assert assert_same(f"{version}-stop", "max_tokens_none")["finished"]["r0"] == ["length", 6]


@pytest.mark.parametrize("version", VERSIONS)
def test_min_tokens_floor(version):
    """9: the first min_tokens outputs are never EOS or a stop id (vLLM masks them: r0's EOS at 1 and
    stop id at 2 do not stop it, its EOS at 4 does); stop strings need more than min_tokens outputs
    (r1's 'b' on token 1 does not stop it, 'cd' on token 3 does)."""
    want = assert_same(f"{version}-stop", "min_tokens_floor")
    assert want["finished"] == {"r0": ["stop", 4], "r1": ["stop", 3]}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["priority_self_preemption", "priority_self_preemption_async"])
def test_priority_self_preemption_does_not_stall(version, name):
    """1: the least important request preempts itself; the others still run and everyone finishes."""
    want = assert_same(version, name)
    assert any(step["preempted"] for step in want["steps"])
    if name == "priority_self_preemption":  # synchronous: r0 itself is the victim of its own decode
        assert any(step["preempted"] == ["r0"] and "r0" not in step["tokens"] for step in want["steps"])
    assert {reason for reason, _ in want["finished"].values()} == {"length"}


def test_self_preemption_continues_only_in_0_33():
    """1: 0.33 schedules the requests after the self-preempted one in the same step; 0.19 does not."""
    new, old = replay("0.33.0", "priority_self_preemption")[0], replay("0.19.1", "priority_self_preemption")[0]
    self_preempt = [s for s in new["steps"] if "r0" in s["preempted"]]
    assert self_preempt and self_preempt[0]["tokens"]
    assert any(s["preempted"] == ["r0"] and not s["tokens"] for s in old["steps"])


def test_passed_over_priority_victim_skips_the_next_request_only_in_0_19():
    """r0 (least important, first in running) is passed over, its step in flight sampling its last token;
    r1 needs a block, r0 is the victim: 0.19.1 then skips r2 in that step, 0.33 schedules it."""
    name = "passed_over_priority_victim"
    old, new = assert_same("0.19.1", name), assert_same("0.33.0", name)
    step = next(i for i, s in enumerate(old["steps"]) if s["preempted"] == ["r0"])
    assert old["steps"][step]["tokens"] == {"r1": 1}
    assert new["steps"][step] == dict(old["steps"][step], tokens={"r1": 1, "r2": 1})
    assert first_difference(old, replay("0.19.1", name, "vllm-0.33")[1]) is not None


@pytest.mark.parametrize("version", VERSIONS)
def test_lone_request_and_threshold(version):
    """2: 0.33 lets a lone request ignore long_prefill_token_threshold; 0.19 always applies it."""
    want = assert_same(version, "lone_request_threshold")
    first = want["steps"][0]["tokens"]["r0"]
    assert first == (100 if version == "0.33.0" else 16)


@pytest.mark.parametrize("version", VERSIONS)
def test_identical_prompts_admitted_together_share_blocks(version):
    """3: blocks enter the prefix cache when allocated: the second identical prompt hits them."""
    want = assert_same(version, "same_step_prefix_sharing")
    assert want["steps"][0]["admitted"] == {"r0": 0, "r1": 100}


@pytest.mark.parametrize("version", VERSIONS)
def test_free_queue_order(version):
    """4: uncached freed blocks are reused first in 0.33, so more of an old prefix survives."""
    want = assert_same(version, "free_queue_order")
    other = "vllm-0.19" if version == "0.33.0" else "vllm-0.33"
    assert first_difference(want, replay(version, "free_queue_order", other)[1]) is not None


@pytest.mark.parametrize("version", VERSIONS)
def test_async_scheduling_adds_a_decode_after_eos(version):
    """5: with async scheduling a request stopping on EOS was already scheduled once more, and the
    waiting request is admitted a step later."""
    sync, async_ = assert_same(version, "eos_stop"), assert_same(version, "eos_stop_async")
    r0 = [s for s in sync["steps"] if "r0" in s["tokens"]]
    r0_async = [s for s in async_["steps"] if "r0" in s["tokens"]]
    assert len(r0_async) == len(r0) + 1
    admit = [i for i, s in enumerate(sync["steps"]) if "r1" in s["admitted"]]
    admit_async = [i for i, s in enumerate(async_["steps"]) if "r1" in s["admitted"]]
    assert admit_async[0] == admit[0] + 1


@pytest.mark.parametrize("version", VERSIONS)
def test_abort_during_a_step_wins_over_its_stop(version):
    """7: an abort arriving while the step that samples EOS runs is applied before its outputs."""
    want = assert_same(version, "abort_during_stopping_step")
    assert want["finished"]["r0"][0] == "abort"


@pytest.mark.parametrize("version", VERSIONS)
def test_prompt_of_max_model_len_is_rejected(version):
    """8: a prompt of exactly max_model_len leaves no room for an output token: refused."""
    want = assert_same(version, "prompt_of_max_model_len")
    assert want["finished"]["r0"] == ["rejected", 0]
    assert want["finished"]["r1"][0] == "length"


@pytest.mark.parametrize("version", VERSIONS)
def test_block_0_is_the_null_block(version):
    """8: 5 blocks of 4 tokens hold 16 tokens only without block 0; r1 (8 tokens) waits until r0
    (growing to 14) finishes, where 5 usable blocks would have let it in beside r0."""
    want = assert_same(version, "null_block")
    last_r0 = max(i for i, s in enumerate(want["steps"]) if "r0" in s["tokens"])
    first_r1 = min(i for i, s in enumerate(want["steps"]) if "r1" in s["tokens"])
    assert first_r1 > last_r0


@pytest.mark.slow
@pytest.mark.parametrize("stop_rules", [False, True])
def test_live_against_installed_vllm(stop_rules):
    """The installed vLLM and servesim agree on fresh random scenarios (seeds beyond the recorded)."""
    pytest.importorskip("vllm")
    from sim.fidelity.conformance import vllm_trace
    profile = profile_for_version(vllm_trace.vllm_version())
    for seed in range(100_000, 100_050):
        scenario = random_scenario(seed, stop_rules)
        diff = first_difference(vllm_trace.run_vllm(scenario), run_servesim(scenario, profile))
        assert diff is None, (seed, diff)


@pytest.mark.parametrize("command", ["compare", "record"])
def test_the_live_commands_say_vllm_is_missing_instead_of_an_import_traceback(command, monkeypatch):
    """docs/spec_decode.md sends readers to `vllm_conformance.py compare --spec`: without vLLM it is one line."""
    import sys
    from tests.benchmark_loader import load_benchmark
    monkeypatch.setitem(sys.modules, "vllm", None)   # as where vLLM is not installed
    with pytest.raises(SystemExit, match=f"^{command} drives vLLM's own scheduler, and vLLM is not installed"):
        load_benchmark("vllm_conformance").main([command, "--spec", "-n", "1"])
