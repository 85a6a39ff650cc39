"""One serving instance as a topology builds it: an engine with an optional CPU KV tier, run by a
plain or a pipeline-parallel process.

    from sim.planning.instances import InstanceShape, simulate_instance
    shape = InstanceShape(pipeline=PipelineConfig(2), offload=OffloadConfig(cpu_bytes=100e9))
    results = simulate_instance(config, shape)
    results = simulate_pipeline(config, PipelineConfig(pipeline_parallel_size=2, link="nvlink4"))

Aggregated deployments in the topology search and each pool of a disaggregated one use these
builders, so PP and a CPU tier combine the same way everywhere: under PP each stage's GPUs copy only
their own layers' pages of a block over their own links, all stages at once (vLLM runs an offloading
worker on every PP rank, each on its layers' KV), so a load lands when the stage with the most layers
has copied its share (sim.planning.offload.stage_copies); a step that waits for nothing but a landing
has that wait shared by layers across the stages (PipelineProcess.stage_seconds). The KV cache is
sized per stage, for the stage's own layers and weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import simpy

from kernels_cost_model.links import get_link
from kernels_cost_model.pipeline import check_pipeline_size, pipeline_kv_cache_blocks, stage_send_time_s
from sim.api.data_parallel import single_rank_only
from sim.planning.pipeline import check_no_auto_length
from sim.api.results import Results
from sim.api.cost_setup import build_cost_model, describe_cost_model
from sim.api.sections import within
from sim.api.simulator import (SimulationConfig, _plain, check_names, require_bookable_blocks, resolve_kv_groups,
                               resolve_kv_layout, resolve_num_gpu_blocks)
from sim.api.validation import check_kv_holds_one_request
from sim.api.spec_setup import speculation_hooks
from sim.core.hybrid_switch import NIXL, OFFLOADING
from sim.core.kv_offload import CPUOffloadKVCacheManager
from sim.core.scheduler_profiles import get_scheduler_profile
from sim.engine.engine import Engine
from sim.engine.simulation import EngineProcess, check_kv_capacity
from sim.planning.engine_run import serve
from sim.planning.offload import OffloadConfig, OffloadTransfers, check_tier_layout, offload_transfers, tier_summary
from sim.planning.pipeline import PipelineConfig, PipelineProcess, check_no_speculation


@dataclass(frozen=True)
class InstanceShape:
    """What an instance adds to the plain engine: pipeline stages and/or a CPU KV tier, and whether
    it is one of a disaggregated pool (its KV moves over NIXL)."""

    pipeline: PipelineConfig | None = None
    offload: OffloadConfig | None = None
    disaggregated: bool = False

    @property
    def connectors(self) -> tuple[str, ...]:
        """The KV connectors vLLM runs this instance with (sim.core.hybrid_switch)."""
        return (NIXL,) * self.disaggregated + (OFFLOADING,) * (self.offload is not None)

    @property
    def pipeline_parallel_size(self) -> int:
        return self.pipeline.pipeline_parallel_size if self.pipeline is not None else 1

    def layer_partition(self, config: SimulationConfig) -> tuple[int, ...]:
        """The layers of each stage (vLLM's partition unless the pipeline pins one), validated."""
        pipeline = self.pipeline or PipelineConfig(1)
        with within("pipeline"):
            return check_pipeline_size(config.deployment.model, pipeline.pipeline_parallel_size,
                                       pipeline.layer_partition)

    def config(self, config: SimulationConfig) -> SimulationConfig:
        """The engine's config: under PP the batch queue plans ahead, so async scheduling is off."""
        return config.replace(engine={"async_scheduling": False}) if self.pipeline_parallel_size > 1 else config

    def num_gpu_blocks(self, config: SimulationConfig) -> int:
        """KV blocks per instance: each stage's GPUs hold its layers' weights and KV and the embedding
        or head it owns, and the stage with the least room sets the count
        (kernels_cost_model.pipeline.pipeline_kv_cache_blocks), per layer group where vLLM keeps its
        hybrid manager for the instance's connectors."""
        d, e, pp = config.deployment, config.engine, self.pipeline_parallel_size
        if pp == 1 or e.num_gpu_blocks is not None:
            return resolve_num_gpu_blocks(config, self.connectors)
        partition = self.layer_partition(config)
        check_no_auto_length(config, pp)
        layout = resolve_kv_layout(config, self.connectors)
        with within("deployment"):
            blocks = pipeline_kv_cache_blocks(d.model, d.gpu, d.tensor_parallel_size, pp, e.block_size,
                                              d.gpu_memory_utilization, e.max_num_batched_tokens, e.max_num_seqs,
                                              kv_cache_dtype=d.kv_cache_dtype,
                                              cudagraph_memory_bytes=round(d.cudagraph_memory_gib * 2**30),
                                              hybrid_manager=layout.is_hybrid, layer_partition=partition)
        if layout.is_hybrid:
            check_kv_holds_one_request(e, d, blocks, layout)
        return require_bookable_blocks(blocks, config)


def build_engine(config: SimulationConfig, shape: InstanceShape, hooks=(),
                 num_gpu_blocks: int | None = None) -> tuple[Engine, OffloadTransfers | None]:
    """The engine of one instance (config already through `shape.config`) and its CPU tier's copy hook, if any."""
    single_rank_only(config.deployment, "a deployment of instances")
    check_names(config.engine)
    e = config.engine
    if shape.offload is not None:
        check_tier_layout(config, shape.connectors, *_tier_setting(shape.offload))
    blocks = check_kv_capacity(num_gpu_blocks if num_gpu_blocks is not None else shape.num_gpu_blocks(config), e)
    groups = _kv_groups(config, shape)
    if shape.offload is None:
        cost = build_cost_model(config.deployment, e, config.speculative_config)
        return Engine(e, cost, blocks, hooks=list(hooks), kv_groups=groups), None
    kv = CPUOffloadKVCacheManager(blocks, e.block_size, e.enable_prefix_caching, shape.offload.cpu_blocks(config),
                                  get_scheduler_profile(e.scheduler_profile).free_uncached_first)
    pp = shape.pipeline_parallel_size
    transfers = offload_transfers(config, shape.offload, starts_when_planned=pp > 1,
                                  layer_partition=shape.layer_partition(config) if pp > 1 else None)
    cost = build_cost_model(config.deployment, e, config.speculative_config)
    return Engine(e, cost, blocks, hooks=[*hooks, transfers], kv=kv), transfers


def _tier_setting(offload: OffloadConfig) -> tuple[str, object]:
    """(field, value) naming a topology's CPU tier: its `kv_offloading_size` in GiB."""
    return ("kv_offloading_size", offload.cpu_bytes / 2**30) if offload.cpu_bytes is not None else offload.setting()


def _kv_groups(config: SimulationConfig, shape: InstanceShape):
    """The KV layer groups the instance runs with its connectors (sim.core.hybrid_switch: several for
    the hybrid manager, None for the plain one). Under PP the scheduler sees the whole model's groups,
    as vLLM's does (each stage holds its layers of each group; 0.19.1 kv_cache_utils.py
    `generate_scheduler_kv_cache_config`). (A CPU tier where vLLM keeps the groups is refused before,
    check_tier_layout.)"""
    return resolve_kv_groups(config, shape.connectors)


def instance_hooks(config: SimulationConfig, shape: InstanceShape) -> list:
    """The spec decoder of config.speculative_config, if any (not simulated under PP)."""
    check_no_speculation(config, shape.pipeline_parallel_size)
    return speculation_hooks(config)


def make_process(env: simpy.Environment, engine: Engine, config: SimulationConfig,
                 shape: InstanceShape) -> EngineProcess:
    """The SimPy process running `engine`: a PP batch queue when PP > 1, the plain loop otherwise."""
    pp = shape.pipeline_parallel_size
    if pp == 1:
        return EngineProcess(env, engine)
    d, link = config.deployment, get_link(shape.pipeline.link)
    return PipelineProcess(env, engine, shape.layer_partition(config),
                           lambda n: stage_send_time_s(d.model, n, link, d.tensor_parallel_size))


def simulate_instance(config: SimulationConfig, shape: InstanceShape, *, workload=None,
                      until: float | None = None) -> Results:
    """One instance of `shape` serving config.workload (or `workload`)."""
    config = shape.config(config)
    engine, reload = build_engine(config, shape, instance_hooks(config, shape))
    proc = make_process(simpy.Environment(), engine, config, shape)
    meta = {"config": _plain(config), "cost_model_description": describe_cost_model(engine.cost_model),
            "pipeline_parallel_size": shape.pipeline_parallel_size,
            "offload": {"num_cpu_blocks": engine.state.kv.num_cpu_blocks, "link": shape.offload.link}
            if reload is not None else None}
    results = serve(config, proc, workload, until, meta)
    if reload is not None:
        results.summary.update(tier_summary(engine.state.kv, reload, results.requests["num_prompt_tokens"].sum()))
    if isinstance(proc, PipelineProcess):
        results.summary["max_batches_in_flight"] = proc.max_in_flight
    results.summary["num_gpus"] = config.deployment.tensor_parallel_size * shape.pipeline_parallel_size
    return results


def simulate_pipeline(config: SimulationConfig, pipeline: PipelineConfig, *, workload=None,
                      until: float | None = None) -> Results:
    """One TP x PP engine serving config.workload (or `workload`): the instance a topology builds with
    these stages (sim.planning.instances), async scheduling off even with one stage."""
    partition = InstanceShape(pipeline=pipeline).layer_partition(config)
    config = config.replace(engine={"async_scheduling": False})   # the PP batch queue plans ahead instead
    results = simulate_instance(config, InstanceShape(pipeline=pipeline), workload=workload, until=until)
    results.meta["pipeline"] = {"pipeline_parallel_size": pipeline.pipeline_parallel_size,
                                "link": get_link(pipeline.link).name, "layer_partition": list(partition)}
    results.summary.setdefault("max_batches_in_flight", 1 if len(results.steps) else 0)
    return results
