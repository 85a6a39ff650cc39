"""What speculation costs beyond the target pass: the EAGLE-3 head priced from its own shape and
the rejection sampler priced by how requests sample (kernels_cost_model.speculative)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model import make_cost_model
from kernels_cost_model.calibration import Calibration, shipped_calibration
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import ConfigError
from kernels_cost_model.speculative import (EAGLE3_DRAFT_VOCAB_SIZE, SAMPLER_BYTES_PER_LOGIT, ProposerCost,
                                            default_draft_overhead, drafter_spec, head_cost_model,
                                            rejection_sampler)
from sim.core.speculative import SpeculativeConfig

TARGET, GPU, VOCAB = "llama-3.1-8b", "h100", 128256


def head(method, family_gemms: bool = False):
    """The drafter's cost model; `family_gemms`: every GEMM at the calibration's matmul family, not
    its per-shape efficiencies (blended between measured shapes, those are not monotone in n: a wider
    GEMM may price up to a few percent cheaper, docs/cost_model.md)."""
    calibration = "default"
    if family_gemms:
        cal = shipped_calibration("h100-sxm")
        calibration = Calibration(cal.device, {k: c for k, c in cal.coeffs.items() if not k.startswith("matmul@")},
                                  cal.provenance, cal.curves)
    return make_cost_model(drafter_spec(method, TARGET), GPU, cpu_overhead=False, calibration=calibration)


def drafting(method, k=3, batch=1, context=300, draft_vocab=None, overhead=0.0, family_gemms=False):
    """Seconds to propose k drafts for `batch` requests that each verified k drafts."""
    model, shape = head_cost_model(method, head(method, family_gemms), draft_vocab)
    cost = ProposerCost(method, k, model, draft_overhead_s=overhead, shape=shape)
    return cost(BatchShape([k + 1] * batch, [context] * batch, batch * (k + 1)), [context + 2] * batch,
                0.01, [k] * batch)


def test_eagle3_head_reads_twice_the_hidden_size_and_its_own_vocabulary():
    model, shape = head_cost_model("eagle3", head("eagle3"))
    base = head("eagle3")
    assert model.qkv.weight == pytest.approx(2 * base.qkv.weight)   # [embedding ; hidden] -> q, k, v
    assert model.lm_head.weight == pytest.approx(base.hidden * EAGLE3_DRAFT_VOCAB_SIZE)
    assert shape.fc.weight == pytest.approx(3 * base.hidden * base.hidden)  # three target layers fused
    assert (shape.draft_vocab, shape.target_vocab) == (EAGLE3_DRAFT_VOCAB_SIZE, VOCAB)


@given(batch=st.integers(1, 256), k=st.integers(1, 6), context=st.integers(1, 4000),
       vocabs=st.lists(st.integers(1000, VOCAB - 1), min_size=2, max_size=4, unique=True))
def test_eagle3_drafting_grows_with_its_draft_vocabulary(batch, k, context, vocabs):
    """Below the target's vocabulary (at it, vLLM skips the map back and the head is cheaper). GEMMs
    at the family's efficiency: the head's own mechanism, not the shape blend's steps (`head`)."""
    vocabs = sorted(vocabs)
    times = [drafting("eagle3", k=k, batch=batch, context=context, draft_vocab=v, family_gemms=True)
             for v in vocabs]
    assert times == sorted(times)
    assert drafting("eagle3", k=k, batch=batch, context=context, draft_vocab=8000) < drafting(
        "eagle3", k=k, batch=batch, context=context, draft_vocab=VOCAB)


@pytest.mark.parametrize("batch", [1, 32])
def test_eagle3_head_costs_more_than_eagle1_at_the_same_vocabulary(batch):
    """Same k, same LM head: EAGLE-3's wider qkv and its three-layer fusion outweigh EAGLE-1's
    fc; with its 32k draft vocabulary it is the cheaper head on the GPU."""
    assert drafting("eagle3", batch=batch, draft_vocab=VOCAB) > drafting("eagle", batch=batch)
    assert drafting("eagle3", batch=batch) < drafting("eagle", batch=batch)


def test_eagle3_pays_its_measured_fixed_cost():
    assert default_draft_overhead("eagle3") > default_draft_overhead("eagle") > 0
    assert drafting("eagle3", overhead=default_draft_overhead("eagle3")) == pytest.approx(2.14e-3, rel=0.02)


def test_a_draft_vocabulary_beyond_the_target_is_a_named_error():
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        head_cost_model("eagle3", head("eagle3"), VOCAB + 1)
    with pytest.raises(ConfigError, match="speculative_config.draft_vocab_size"):
        SpeculativeConfig("eagle3", draft_vocab_size=0)
    with pytest.raises(ConfigError, match="eagle3"):
        SpeculativeConfig("eagle", draft_vocab_size=32000)


def sampler(mode):
    return rejection_sampler(make_cost_model(TARGET, GPU, cpu_overhead=False), VOCAB, mode)


def test_sampling_modes_order_greedy_random_top_p():
    assert list(SAMPLER_BYTES_PER_LOGIT) == ["greedy", "random", "top_p"]
    times = [sampler(mode)(512) for mode in SAMPLER_BYTES_PER_LOGIT]
    assert times == sorted(times) and times[0] < times[1] < times[2]
    assert sampler("top_p")(0) == 0.0
    assert sampler("top_p")(512) > 2e-3 > sampler("top_p")(4)  # batch 128 x (1 + 3) vs batch 1


@given(st.lists(st.integers(0, 5), min_size=1, max_size=40))
def test_the_sampler_prices_every_verified_position_once(drafts):
    s = sampler("top_p")
    model, shape = head_cost_model("eagle3", head("eagle3"))
    rows = len(drafts)
    batch = BatchShape([d + 1 for d in drafts], [200] * rows, rows + sum(drafts))
    with_sampler = ProposerCost("eagle3", 5, model, shape=shape, sampler=s)(batch, [202] * rows, 0.01, drafts)
    without = ProposerCost("eagle3", 5, model, shape=shape)(batch, [202] * rows, 0.01, drafts)
    assert with_sampler - without == pytest.approx(s(sum(d + 1 for d in drafts if d)))


def test_an_unknown_sampling_mode_is_a_named_error():
    with pytest.raises(ConfigError, match="speculative_config.target_sampling"):
        SpeculativeConfig("eagle3", target_sampling="nucleus")
    with pytest.raises(ConfigError, match="speculative_config.target_sampling"):
        sampler("nucleus")


def test_top_p_sampling_slows_a_batch_but_emits_the_same_tokens():
    from sim.api.simulator import SimulationConfig, simulate
    from workloads import ClosedLoopClients
    from workloads.lengths import Fixed, Independent

    def run(sampling):
        config = SimulationConfig().replace(
            deployment={"model": TARGET, "gpu": GPU}, engine={"max_model_len": 4096},
            speculative_config={"method": "eagle3", "num_speculative_tokens": 3, "target_sampling": sampling})
        return simulate(config, workload=ClosedLoopClients(16, 16, Independent(Fixed(64), Fixed(32)),
                                                           max_tokens=None)).summary

    greedy, top_p = run("greedy"), run("top_p")
    assert top_p["output_throughput"] < greedy["output_throughput"]
    for key in ("spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens"):
        assert top_p[key] == greedy[key]


def test_an_mtp_head_of_a_model_with_leading_dense_layers_is_one_moe_layer():
    """DeepSeek-V3's first three layers are dense; its MTP block is a MoE block of ~14 B parameters. The
    one-layer head once kept `first_k_dense_replace=3`: -2 MoE layers, a negative parameter count, and
    more KV blocks with MTP on than off."""
    from kernels_cost_model.speculative import drafter_spec
    from sim import SimulationConfig
    from sim.api.simulator import resolve_num_gpu_blocks
    head = drafter_spec("mtp", "deepseek-v3")
    assert head.num_layers == 1 and 13e9 < head.num_params() < 15e9
    deployment = {"model": "deepseek-v3", "gpu": "h200", "tensor_parallel_size": 8}
    off = resolve_num_gpu_blocks(SimulationConfig(deployment=deployment))
    on = resolve_num_gpu_blocks(SimulationConfig(deployment=deployment,
                                                 speculative_config={"method": "mtp", "num_speculative_tokens": 1}))
    assert on < off


@pytest.mark.parametrize("target, method", [("gemma-3-27b", "eagle3"), ("llama-4-scout", "eagle3"),
                                            ("gpt-oss-120b", "eagle3"), ("qwen3-next-80b-a3b", "mtp")])
def test_a_hybrid_targets_head_is_one_full_attention_layer(target, method):
    """The head's one layer runs full attention: the target's per-layer kinds (sliding, chunked, linear)
    are its own 36-62 layers, and the head priced every one of them (Gemma-3's at ~9x its one layer)."""
    spec = drafter_spec(method, target)
    assert spec.num_layers == 1 and spec.layer_types == ()
    model = make_cost_model(spec, "h200", cpu_overhead=False)
    assert getattr(model, "counts", {"full_attention": 1}) == {"full_attention": 1}
    one_layer = make_cost_model(dataclasses.replace(spec, name="plain"), "h200", cpu_overhead=False)
    batch = BatchShape([1] * 64, [2000] * 64, 64)
    assert model.step_time(batch) == one_layer.step_time(batch)


def test_only_an_mtp_head_keeps_the_targets_qk_norms():
    """Qwen3-Next's MTP layer is its own attention layer (q/k norms); an EAGLE head is a Llama layer."""
    assert drafter_spec("mtp", "qwen3-next-80b-a3b").qk_norm_layers == 1
    assert drafter_spec("eagle3", "qwen3-next-80b-a3b").qk_norm_layers == 0
    assert drafter_spec("eagle3", "qwen3-32b").qk_norm_layers == 0
