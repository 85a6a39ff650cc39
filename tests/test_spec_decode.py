"""Speculative decoding, case by case: stops inside a multi-token step, caps on drafts, the
acceptance models, the proposer's price, config and CLI (issue 16)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from kernels_cost_model.errors import ConfigError
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.sampling_params import SamplingParams
from sim.core.speculative import SpeculativeConfig
from sim.engine.engine import Engine
from sim.engine.spec_decode import SpecDecoder
from tests.engine_harness import EOS, drive
from workloads.acceptance import PositionalAcceptance, ScriptedAcceptance, make_acceptance
from workloads.spec import RequestSpec

TEXT = {EOS: "", 3: "a", 4: "b", 5: "c", 6: "d"}
ACCEPT_ALL = ScriptedAcceptance({}, default=lambda i, p, d: d)


def one_request(stream, params, *, k=3, prompt_len=8, max_model_len=64, profile="vllm",
                acceptance=ACCEPT_ALL, method="eagle3"):
    """Run one request through a spec-decoding engine; (request, step log)."""
    config = EngineConfig(block_size=4, num_gpu_blocks=64, max_model_len=max_model_len, eos_token_id=EOS,
                          stop_profile=profile, check_invariants=True, async_scheduling=False,
                          stop_string_detection="engine")  # the engine's own view of each stop
    hook = SpecDecoder(SpeculativeConfig(method, num_speculative_tokens=k), acceptance)
    engine = Engine(config, LinearCostModel(), 64, token_text=TEXT, hooks=[hook])
    finished = []
    engine.on_finish = finished.append
    spec = RequestSpec(0.0, np.arange(prompt_len, dtype=np.int32) + 100, output_token_ids=tuple(stream),
                       sampling_params=params, request_id="r")
    logs = drive(engine, [spec])
    return finished[0], [row for log in logs for row in log.rows], engine


def test_eos_inside_an_accepted_run_stops_there_and_drops_the_rest():
    req, rows, _ = one_request([5, 5, EOS, 5, 5, 5], SamplingParams(max_tokens=20))
    assert req.output_token_ids == [5, 5, EOS] and req.finish_reason == "stop"
    assert [r[4] for r in rows] == [1, 2]  # prefill samples one; the verify step keeps 2 of 4


def test_stop_token_inside_an_accepted_run_names_itself():
    req, _, _ = one_request([5, 6, 7, 5, 5], SamplingParams(max_tokens=20, stop_token_ids=[7]))
    assert req.output_token_ids == [5, 6, 7] and req.stop_reason == 7


@pytest.mark.parametrize("profile, reason", [("vllm", "stop"), ("vllm-v1-2025", "length")])
def test_eos_on_the_max_tokens_tie_inside_a_multi_token_step(profile, reason):
    req, rows, _ = one_request([5, 5, 5, EOS, 5], SamplingParams(max_tokens=4), profile=profile)
    assert req.output_token_ids == [5, 5, 5, EOS] and req.finish_reason == reason
    assert rows[1][2] == 4  # 1 + all 3 drafts, though 3 outputs remain: vLLM does not cap drafts at max_tokens


def test_min_tokens_ignores_an_early_eos_inside_a_run():
    req, _, _ = one_request([5, EOS, 5, 5, EOS, 5, 5], SamplingParams(max_tokens=20, min_tokens=3))
    assert req.output_token_ids == [5, EOS, 5, 5, EOS] and req.finish_reason == "stop"


def test_stop_string_completed_by_the_second_of_three_accepted_tokens():
    script = ScriptedAcceptance({0: [2]})  # the verify step accepts 2 drafts + the bonus token
    req, rows, _ = one_request([6, 3, 4, 5, 5, 5], SamplingParams(max_tokens=20, stop=["ab"]),
                               acceptance=script)
    assert req.output_token_ids == [6, 3, 4] and req.stop_reason == "ab"
    assert req.text_state.text == "d"
    assert rows[1][4] == 2  # 3 tokens accepted, the one after the stop string dropped


def test_max_model_len_reached_mid_run_caps_drafts_and_positions():
    req, rows, _ = one_request([5] * 20, SamplingParams(max_tokens=50), prompt_len=10, max_model_len=14)
    assert len(req.output_token_ids) == 4 and req.finish_reason == "length"
    assert all(computed + n <= 14 - 1 for _, computed, n, _, _ in rows[1:])


def test_rejected_drafts_are_uncomputed_and_their_slots_reused():
    script = ScriptedAcceptance({0: [0, 1, 3]})
    req, rows, engine = one_request([5] * 30, SamplingParams(max_tokens=9, ignore_eos=True),
                                    acceptance=script)
    assert [r[4] for r in rows] == [1, 1, 2, 4, 1]  # bonus only, 1 + bonus, 3 + bonus, then capped
    # after step 2 (0 of 3 accepted) the request recomputes from 9 prompt+output tokens minus one
    before = [computed for _, computed, _, _, _ in rows]
    assert before[2] == 8 + 1 and before[3] == 8 + 1 + 2
    assert engine.state.kv.num_free_blocks == engine.state.kv.num_usable_blocks


def test_preempted_request_drops_its_drafts():
    from policies.base import Policy, SchedulerOutput
    req, _, engine = one_request([5] * 4, SamplingParams(max_tokens=4))
    req.status, req.num_spec_tokens = req.status.RUNNING, 3
    engine.state.running.append(req)
    Policy.preempt(engine.state, req, SchedulerOutput())
    assert req.num_spec_tokens == 0 and req.num_computed_tokens == 0


# ----- acceptance models -------------------------------------------------------------------
def test_positional_acceptance_is_schedule_independent_and_matches_its_rates():
    model = PositionalAcceptance((0.8, 0.6, 0.5), seed=7)
    draws = [model.num_accepted(i, p, 3) for i in range(200) for p in range(50)]
    assert draws == [model.num_accepted(i, p, 3) for i in range(200) for p in range(50)]
    assert abs(1 + np.mean(draws) - model.expected_length(3)) < 0.03
    assert model.expected_length(3) == pytest.approx(1 + 0.8 + 0.48 + 0.24)
    other = [PositionalAcceptance((0.8, 0.6, 0.5), seed=8).num_accepted(i, 0, 3) for i in range(200)]
    assert other != draws[::50]


def test_fewer_drafts_accept_a_prefix_of_the_same_decisions():
    model = PositionalAcceptance((0.7,), seed=1)
    for i in range(300):
        full = model.num_accepted(i, 5, 4)
        assert all(model.num_accepted(i, 5, d) == min(full, d) for d in range(5))


def test_presets_and_named_errors():
    assert make_acceptance("eagle3", "gsm8k").rates != make_acceptance("eagle3", "sharegpt").rates
    assert make_acceptance("eagle", rates=[0.5]).rates == (0.5,)
    # vLLM issue #20780's MT-Bench acceptance lengths (two decimals) for k = 2..7
    for method, lengths in (("eagle", (2.10, 2.29, 2.39, 2.43, 2.45, 2.47)),
                            ("eagle3", (2.36, 2.79, 3.08, 3.32, 3.46, 3.54))):
        model = make_acceptance(method, "mtbench")
        for k, length in zip(range(2, 8), lengths):
            assert model.expected_length(k) == pytest.approx(length, abs=0.015)
    assert make_acceptance("eagle").rates == make_acceptance("eagle", "mtbench").rates
    with pytest.raises(ConfigError, match="acceptance_dataset.*give acceptance_rates"):
        make_acceptance("draft_model")
    with pytest.raises(ConfigError, match="acceptance_dataset"):
        make_acceptance("eagle3", "nonesuch")


# ----- config and CLI ------------------------------------------------------------------------
@pytest.mark.parametrize("data, field", [
    ({"method": "medusa"}, "speculative_config.method"),
    ({"method": "eagle3", "num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
    ({"method": "draft_model"}, "speculative_config.model"),
    ({"method": "eagle3", "acceptance_rates": [1.5]}, "speculative_config.acceptance_rates"),
    ({"num_spec_tokens": 3}, "speculative_config.num_spec_tokens"),
])
def test_bad_speculative_config_names_the_field(data, field):
    with pytest.raises(ConfigError) as err:
        SpeculativeConfig.from_dict(data)
    assert err.value.field == field


def test_speculative_config_from_toml_and_policy_check(tmp_path):
    from sim.api.simulator import SimulationConfig
    path = tmp_path / "c.toml"
    path.write_text('[speculative_config]\nmethod = "ngram"\nnum_speculative_tokens = 5\n')
    config = SimulationConfig.from_toml(path)
    assert config.speculative_config == SpeculativeConfig("ngram", num_speculative_tokens=5)
    assert config.replace(speculative_config={"num_speculative_tokens": 2}).speculative_config.method == "ngram"
    with pytest.raises(ConfigError, match="engine.policy"):
        config.replace(engine={"policy": "sarathi"})


def test_cli_flag_takes_vllm_json(capsys):
    from sim.cli.main import main
    flag = json.dumps({"method": "eagle3", "num_speculative_tokens": 2})
    assert main(["run", "--cost-model", "linear", "--num-requests", "20", "--rate", "4",
                 "--num-gpu-blocks", "4096", "--speculative-config", flag, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["spec_decode_num_draft_tokens"] > 0
    assert 0 < summary["spec_decode_acceptance_rate"] < 1
    assert main(["run", "--speculative-config", "{method: eagle3}"]) == 2
    assert "speculative_config" in capsys.readouterr().err


def test_a_speculative_config_without_a_method_is_an_error_not_eagle3(tmp_path, capsys):
    from sim.api.simulator import SimulationConfig
    from sim.cli.main import main
    path = tmp_path / "c.toml"
    path.write_text("[speculative_config]\n")
    for build in (lambda: SimulationConfig.from_toml(path), lambda: SimulationConfig(speculative_config={}),
                  lambda: SpeculativeConfig.from_json('{"num_speculative_tokens": 2}')):
        with pytest.raises(ConfigError) as err:
            build()
        assert err.value.field == "speculative_config.method" and "eagle3" in err.value.reason
    assert main(["run", "--speculative-config", "{}"]) == 2
    assert capsys.readouterr().err.startswith("servesim: error: speculative_config.method=None: give a method")


# ----- cost and metrics ------------------------------------------------------------------------
def test_speculation_pays_at_low_load_and_metrics_agree(tmp_path):
    from sim.api.simulator import SimulationConfig, simulate
    from sim.plots import save_plots
    base = SimulationConfig().replace(workload={"num_requests": 40, "rate": 1.0, "max_tokens": 64})
    plain = simulate(base)
    spec = simulate(base.replace(speculative_config={"method": "eagle3", "num_speculative_tokens": 3}))
    s = spec.summary
    assert s["mean_tpot_ms"] < plain.summary["mean_tpot_ms"] / 1.3
    assert s["spec_decode_acceptance_length"] == pytest.approx(
        1 + s["spec_decode_num_accepted_tokens"] / s["spec_decode_num_drafts"])
    assert s["spec_decode_acceptance_rate_pos_1"] >= s["spec_decode_acceptance_rate_pos_3"]
    assert spec.requests["num_output_tokens"].tolist() == plain.requests["num_output_tokens"].tolist()
    assert "spec_decode.png" in {p.name for p in save_plots(spec, tmp_path / "spec")}
    assert "spec_decode.png" not in {p.name for p in save_plots(plain, tmp_path / "plain")}


def test_proposer_cost_by_method():
    from kernels_cost_model import make_cost_model
    from kernels_cost_model.batch import BatchShape
    from kernels_cost_model.speculative import ProposerCost, drafter_spec
    batch = BatchShape([4] * 8, [1000] * 8, 32)
    head = make_cost_model(drafter_spec("eagle3", "qwen2.5-7b"), "h100", cpu_overhead=False)
    draft = make_cost_model(drafter_spec("draft_model", "qwen2.5-7b", "qwen2.5-0.5b"), "h100",
                            cpu_overhead=False)
    target = make_cost_model("qwen2.5-7b", "h100").step_time(batch)
    eagle = ProposerCost("eagle3", 3, head)(batch, [1004] * 8, target)
    model = ProposerCost("draft_model", 3, draft)(batch, [1004] * 8, target)
    ngram = ProposerCost("ngram", 3)(batch, [1004] * 8, target)
    assert ngram < eagle < model < target
    assert ProposerCost("eagle3", 5, head)(batch, [1004] * 8, target) > eagle


def test_prefill_chunks_and_verifications_share_a_step():
    config = EngineConfig(block_size=4, num_gpu_blocks=128, max_model_len=256, eos_token_id=EOS,
                          max_num_batched_tokens=24, check_invariants=True, async_scheduling=False)
    hook = SpecDecoder(SpeculativeConfig("eagle3", num_speculative_tokens=3), ACCEPT_ALL)
    engine = Engine(config, LinearCostModel(), 128, hooks=[hook])
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    specs = [RequestSpec(0.0, np.arange(8, dtype=np.int32) + 100, sampling_params=params,
                         request_id="decoding"),
             RequestSpec(0.02, np.arange(100, dtype=np.int32) + 300, sampling_params=params,
                         request_id="prefilling")]
    mixed = [log for log in drive(engine, specs)
             if {r[0] for r in log.rows} == {"decoding", "prefilling"}
             and any(r[0] == "decoding" and r[2] == 4 for r in log.rows)
             and any(r[0] == "prefilling" and r[4] == 0 for r in log.rows)]
    assert mixed  # a 1 + 3 verification row beside a prefill chunk, within one 24-token budget
    assert all(sum(r[2] for r in log.rows) <= 24 for log in mixed)


def test_drafter_weights_and_kv_shrink_the_cache():
    from sim.api.simulator import SimulationConfig, resolve_num_gpu_blocks
    base = SimulationConfig().replace(deployment={"model": "qwen2.5-7b"})
    plain = resolve_num_gpu_blocks(base)
    blocks = {method: resolve_num_gpu_blocks(base.replace(speculative_config=dict(method=method, model=model)))
              for method, model in (("ngram", None), ("eagle3", None), ("draft_model", "qwen2.5-0.5b"))}
    assert blocks["ngram"] == plain
    assert blocks["draft_model"] < blocks["eagle3"] < plain
    assert blocks["eagle3"] > plain * 0.9  # one extra layer of KV (of 28) and its weights


def test_verification_rows_are_priced_as_decode_rows_with_several_queries():
    from kernels_cost_model import make_cost_model
    from kernels_cost_model.batch import BatchShape
    from kernels_cost_model.speculative import verify_step_time
    cost = make_cost_model("llama-3.1-8b", "h100")
    plain = cost.step_time(BatchShape([1] * 128, [400] * 128, 128))
    times = [verify_step_time(cost, BatchShape([1 + k] * 128, [400] * 128, 128 * (1 + k)), [k] * 128)
             for k in (1, 3, 5)]
    as_chunks = cost.step_time(BatchShape([4] * 128, [400] * 128, 512))
    assert plain < times[0] < times[1] < times[2]
    assert times[1] < plain * 2  # k = 3 at batch 128
    # the same launch priced as 4-token chunks (the cached context off the chunk's tile term) agrees
    assert as_chunks == pytest.approx(times[1], rel=0.03)
    mixed = BatchShape([4, 200], [400, 0], 5)  # a prefill chunk beside a verification row
    assert verify_step_time(cost, mixed, [3, 0]) == pytest.approx(cost.step_time(mixed), rel=0.01)
    assert verify_step_time(cost, mixed, [0, 0]) == cost.step_time(mixed)
    linear = LinearCostModel()
    assert verify_step_time(linear, mixed, [3, 0]) == linear.step_time(mixed)


def test_a_draft_model_keeps_async_scheduling_off_by_default_under_vllm_019_only():
    """vLLM 0.19 turns async scheduling on by default only for EAGLE/MTP and GPU n-gram drafts; 0.33 for all."""
    from sim.api.simulator import SimulationConfig
    spec = dict(method="draft_model", model="qwen2.5-0.5b")
    for profile, is_async in (("vllm-0.19", False), ("vllm-0.33", True)):
        config = SimulationConfig(engine={"scheduler_profile": profile}, deployment={"model": "qwen2.5-7b"},
                                  speculative_config=spec)
        assert config.engine.is_async is is_async
    asked = SimulationConfig(engine={"scheduler_profile": "vllm-0.19", "async_scheduling": True},
                             deployment={"model": "qwen2.5-7b"}, speculative_config=spec)
    assert asked.engine.is_async  # allowed when asked for


def _first_chunks(method: str, profile: str, prompts=(600,), budget=256, max_num_seqs=32) -> list[int]:
    """Tokens each prompt gets in the first step of an engine speculating with `method`."""
    config = EngineConfig(block_size=16, num_gpu_blocks=400, max_model_len=2048, max_num_batched_tokens=budget,
                          max_num_seqs=max_num_seqs, scheduler_profile=profile, async_scheduling=False,
                          eos_token_id=EOS, check_invariants=True)
    model = "qwen2.5-0.5b" if method == "draft_model" else None
    hook = SpecDecoder(SpeculativeConfig(method, model=model, num_speculative_tokens=3), ACCEPT_ALL)
    engine = Engine(config, LinearCostModel(), 400, token_text=TEXT, hooks=[hook])
    for i, n in enumerate(prompts):
        engine.add_request(RequestSpec(0.0, np.arange(n, dtype=np.int32) + 100, output_len=4,
                                       sampling_params=SamplingParams(max_tokens=4), request_id=f"r{i}"), 0.0)
    return [n for _, n in engine.plan_step(0.0).plan.scheduled]


def test_a_draft_model_takes_its_slots_out_of_the_token_budget():
    """vLLM runs a draft model over the verified tokens plus one slot a request: 0.19 takes one slot per
    seat off the step budget (max_num_scheduled_tokens = 256 - 32), 0.33 charges each scheduled row its
    slot (a row takes at most what leaves it). EAGLE adds no slot."""
    assert _first_chunks("eagle3", "vllm-0.33") == [256]
    assert _first_chunks("draft_model", "vllm-0.19") == [224]
    assert _first_chunks("draft_model", "vllm-0.33") == [255]
    assert _first_chunks("draft_model", "vllm-0.33", prompts=(100, 600)) == [100, 154]   # 256 - 101 - 1
    assert _first_chunks("eagle3", "vllm-0.33", prompts=(100, 600)) == [100, 156]


def test_a_draft_model_under_0_19_needs_a_budget_above_its_seats():
    with pytest.raises(ConfigError, match="engine.max_num_batched_tokens=32: must exceed max_num_seqs=32"):
        _first_chunks("draft_model", "vllm-0.19", budget=32, max_num_seqs=32)
    assert _first_chunks("draft_model", "vllm-0.33", budget=32, max_num_seqs=32) == [31]
    with pytest.raises(ConfigError, match="engine.max_num_batched_tokens=1: must be at least 2"):
        _first_chunks("draft_model", "vllm-0.33", budget=1, max_num_seqs=1)


def test_under_0_33_the_budget_must_hold_a_padded_decode_row():
    """vLLM 0.33 pads a one-token admission to 1 + k tokens (k = 3) and waits rather than schedule it
    unpadded, so a budget below that (plus a draft model's slot) could leave a request waiting for good (a
    fuzz case ended in "never finished"); 0.19 schedules the one token."""
    with pytest.raises(ConfigError, match="engine.max_num_batched_tokens=3: must be at least 4 with 3 speculative"):
        _first_chunks("eagle3", "vllm-0.33", budget=3, max_num_seqs=1)
    with pytest.raises(ConfigError, match="engine.max_num_batched_tokens=4: must be at least 5 .* draft model"):
        _first_chunks("draft_model", "vllm-0.33", budget=4, max_num_seqs=1)
    assert _first_chunks("eagle3", "vllm-0.33", budget=4, max_num_seqs=1) == [4]
    assert _first_chunks("eagle3", "vllm-0.19", budget=3, max_num_seqs=1) == [3]
