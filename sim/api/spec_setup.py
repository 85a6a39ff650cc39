"""Builds speculative decoding for one simulation: the engine hook, its proposer cost, KV size."""
from __future__ import annotations

from dataclasses import replace

from kernels_cost_model.errors import require
from sim.core.cost import LinearCostModel
from sim.core.scheduler_profiles import get_scheduler_profile
from sim.core.speculative import SpeculativeConfig
from sim.engine.spec_decode import SpecDecoder
from workloads.acceptance import make_acceptance

#: Layers of the model the LinearCostModel defaults describe (Llama-3-8B): a one-layer head costs
#: 1/32 of its per-step terms under the linear model.
LINEAR_MODEL_LAYERS = 32


#: Releases whose unset async scheduling stays off with a draft-model proposer (vLLM 0.19's
#: vllm/config/vllm.py enables it by default only for EAGLE/MTP and GPU n-gram drafts; 0.33 for all).
SYNC_DRAFT_MODEL_RELEASES = ("0.19",)


def check_speculative(spec: SpeculativeConfig | None, engine):
    """The engine config speculative decoding runs with: vLLM V1's policy (it schedules what a
    request lacks, drafts included). Async scheduling works with the GPU proposers; n-gram
    drafting is synchronous (vLLM 0.19's V1 model runner: its CPU proposer), so an unset
    async_scheduling turns off with it and asking for it is an error. vLLM 0.19 also leaves async
    scheduling off by default with a draft model (it runs one only when asked)."""
    if spec is None:
        return engine
    require(engine.policy == "vllm", "engine.policy", engine.policy,
            "speculative_config needs policy 'vllm' (the V1 scheduler schedules drafts)")
    if spec.method == "draft_model" and engine.async_scheduling is None:
        if get_scheduler_profile(engine.scheduler_profile).release in SYNC_DRAFT_MODEL_RELEASES:
            return replace(engine, async_scheduling=False)
    if spec.method != "ngram":
        return engine
    require(engine.async_scheduling is not True, "engine.async_scheduling", True,
            "n-gram drafting runs on the CPU after sampling: vLLM keeps it synchronous; "
            "leave async_scheduling unset or false, or pick a GPU proposer (eagle, eagle3, mtp)")
    return replace(engine, async_scheduling=False)


def check_mtp_layers(spec: SpeculativeConfig | None, deployment) -> None:
    """vLLM's "mtp" drafts with the target checkpoint's own MTP layers: a model without them is an error.
    An unknown model is left for simulate() to name."""
    if spec is None or spec.method != "mtp":
        return
    from kernels_cost_model import get_model
    from kernels_cost_model.errors import ConfigError
    try:
        model = get_model(deployment.model)
    except ConfigError:
        return
    require(model.num_mtp_layers > 0, "speculative_config.method", "mtp",
            f"{model.name} has no multi-token-prediction layers (its config.json sets neither "
            "num_nextn_predict_layers nor mtp_num_hidden_layers); pick eagle, eagle3, draft_model or ngram")


def build_spec_decoder(spec: SpeculativeConfig, deployment, seed: int) -> SpecDecoder:
    """The hook: seeded acceptance model and the proposer's cost for this deployment."""
    acceptance = make_acceptance(spec.method, spec.acceptance_dataset, spec.acceptance_rates, seed)
    return SpecDecoder(spec, acceptance, proposer_cost(spec, deployment))


def speculation_hooks(config) -> list:
    """[the spec decoder] of a SimulationConfig with a speculative_config, else []."""
    spec = config.speculative_config
    return [build_spec_decoder(spec, config.deployment, config.seed)] if spec is not None else []


def proposer_cost(spec: SpeculativeConfig, deployment):
    """ProposerCost with the drafter priced by the deployment's kind of cost model."""
    from kernels_cost_model import get_model, make_cost_model
    from kernels_cost_model.speculative import (NGRAM_FRACTION_OF_STEP, ProposerCost, default_draft_overhead,
                                                drafter_spec, head_cost_model, rejection_sampler)
    overhead = default_draft_overhead(spec.method) if spec.draft_overhead_s is None else spec.draft_overhead_s
    fraction = NGRAM_FRACTION_OF_STEP if spec.ngram_fraction_of_step is None else spec.ngram_fraction_of_step
    drafter = drafter_spec(spec.method, deployment.model, spec.model)
    draft, shape, sampler = None, None, None
    if drafter is not None and deployment.cost_model == "linear":
        draft = _scaled_linear(drafter, deployment.model)
    elif deployment.cost_model != "linear":
        tp = deployment.tensor_parallel_size
        target = get_model(deployment.model)
        if drafter is not None:
            draft = make_cost_model(drafter, deployment.gpu, tp, cpu_overhead=False, clocks=deployment.clocks)
            draft, shape = head_cost_model(spec.method, draft, spec.draft_vocab_size)
        priced_on = draft if draft is not None else make_cost_model(target, deployment.gpu, tp, cpu_overhead=False,
                                                                    clocks=deployment.clocks)
        sampler = rejection_sampler(priced_on, target.vocab_size, spec.target_sampling)
    tree = spec.tree
    widths = tuple(tree.level_widths(len(tree))) if tree is not None else None
    return ProposerCost(spec.method, spec.num_speculative_tokens, draft, overhead, fraction, widths,
                        shape, sampler)


def _scaled_linear(drafter, target) -> LinearCostModel:
    """The linear model shrunk by the drafter's share of the target's parameters."""
    from kernels_cost_model import get_model
    ratio = drafter.num_params() / get_model(target).num_params()
    base = LinearCostModel()
    return replace(base, fixed_s=base.fixed_s * ratio, per_new_token_s=base.per_new_token_s * ratio,
                   per_context_token_s=base.per_context_token_s * ratio)


def spec_num_gpu_blocks(spec: SpeculativeConfig, deployment, engine, layout=None) -> int:
    """KV blocks left when the drafter's weights and KV share the GPU (vLLM sizes them together);
    `layout`: a hybrid target's layout as the run holds it, the drafter's layers grouped in."""
    from kernels_cost_model.speculative import drafter_spec, proposer_kv_cache_blocks
    return proposer_kv_cache_blocks(deployment.model, deployment.gpu,
                                    drafter_spec(spec.method, deployment.model, spec.model),
                                    deployment.tensor_parallel_size, engine.block_size,
                                    deployment.gpu_memory_utilization, engine.max_num_batched_tokens,
                                    kv_cache_dtype=deployment.kv_cache_dtype, max_num_seqs=engine.max_num_seqs,
                                    cudagraph_memory_bytes=round(deployment.cudagraph_memory_gib * 2**30),
                                    layout=layout)
