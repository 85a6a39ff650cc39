"""CPU KV offload for one engine: a host-memory tier under the GPU prefix cache, priced by its link.

    from sim.planning.offload import OffloadConfig, simulate_offload
    results = simulate_offload(config, OffloadConfig(cpu_bytes=64e9, link="pcie5"))
    results.summary["gpu_prefix_hit_rate"], results.summary["cpu_prefix_hit_rate"]

The tier (sim.core.kv_offload) keeps blocks the GPU cache evicts; a request whose prefix hits there
loads those blocks back before it computes: the step that admits it lasts longer by the copy
(latency + bytes / (tensor_parallel_size x link bandwidth): each GPU loads its own KV shard over
its own PCIe link). Size: `cpu_bytes` of host memory (vLLM's `kv_offloading_size`) or
`num_cpu_blocks` directly.
"""
from __future__ import annotations

from dataclasses import dataclass

import simpy

from kernels_cost_model.errors import ConfigError, require
from kernels_cost_model.links import get_link, kv_transfer_bytes
from sim.api.data_parallel import single_rank_only
from sim.api.results import Results
from sim.planning.engine_run import serve
from sim.api.simulator import SimulationConfig, build_cost_model, check_names, resolve_num_gpu_blocks, within
from sim.api.spec_setup import speculation_hooks
from sim.core.fields import is_number
from sim.core.hooks import EngineHook
from sim.core.scheduler_profiles import get_scheduler_profile
from sim.core.kv_offload import CPUOffloadKVCacheManager, check_cpu_tier
from sim.engine.engine import Engine
from sim.engine.simulation import EngineProcess, check_kv_capacity


MAX_KV_OFFLOADING_GIB = 1e5
"""Largest CPU KV tier, GiB of host memory per instance: beyond what any one server holds (a few TiB)."""


def check_offloading_size(field: str, size) -> None:
    """ConfigError naming `field` unless `size` (GiB) is a finite number in (0, MAX_KV_OFFLOADING_GIB]."""
    require(is_number(size) and 0 < size <= MAX_KV_OFFLOADING_GIB, field, size,
            f"must be a finite number of GiB in (0, {MAX_KV_OFFLOADING_GIB:g}]")


@dataclass(frozen=True)
class OffloadConfig:
    """Host-memory KV tier: its size (bytes of host memory, or blocks) and the link to the GPU."""

    cpu_bytes: float | None = None
    num_cpu_blocks: int | None = None
    link: str = "pcie5"

    def __post_init__(self) -> None:
        require((self.cpu_bytes is None) != (self.num_cpu_blocks is None), "offload.cpu_bytes",
                self.cpu_bytes, "give exactly one of cpu_bytes and num_cpu_blocks")
        most = MAX_KV_OFFLOADING_GIB * 2**30
        require(self.cpu_bytes is None or (is_number(self.cpu_bytes) and 0 < self.cpu_bytes <= most), "offload.cpu_bytes",
                self.cpu_bytes, f"must be a finite number of bytes in (0, {MAX_KV_OFFLOADING_GIB:g} GiB]")
        with within("offload"):
            get_link(self.link)

    def cpu_blocks(self, config: SimulationConfig) -> int:
        """The tier's size in blocks; a tier smaller than one block is a named error."""
        block_bytes = kv_transfer_bytes(config.deployment.model, config.engine.block_size)
        if self.num_cpu_blocks is not None:
            require(isinstance(self.num_cpu_blocks, int) and self.num_cpu_blocks >= 1, "offload.num_cpu_blocks",
                    self.num_cpu_blocks, "the CPU tier must hold at least one block")
            return self.num_cpu_blocks
        if self.cpu_bytes < block_bytes:
            raise ConfigError("offload.cpu_bytes", self.cpu_bytes,
                              f"smaller than one KV block ({block_bytes} bytes: {config.engine.block_size} tokens "
                              f"of {config.deployment.model})")
        return int(self.cpu_bytes // block_bytes)


class ReloadPricing(EngineHook):
    """Adds the host-to-device copy of the blocks reloaded for a step to that step's duration."""

    def __init__(self, seconds_per_blocks, check: bool):
        self.seconds_per_blocks, self.check = seconds_per_blocks, check
        self.load_s = 0.0

    def on_plan(self, engine, step) -> None:
        blocks = engine.state.kv.take_loaded_blocks()
        if blocks:
            seconds = self.seconds_per_blocks(blocks)
            step.duration += seconds
            self.load_s += seconds

    def on_step_end(self, engine, now: float) -> None:
        if self.check:
            check_cpu_tier(engine.state.kv)


def simulate_offload(config: SimulationConfig, offload: OffloadConfig, *, workload=None,
                     until: float | None = None) -> Results:
    """One engine with a CPU KV tier serving config.workload (or `workload`)."""
    single_rank_only(config.deployment, "KV offloading")
    check_names(config.engine)
    e = config.engine
    blocks = check_kv_capacity(resolve_num_gpu_blocks(config), e)
    kv = CPUOffloadKVCacheManager(blocks, e.block_size, e.enable_prefix_caching, offload.cpu_blocks(config),
                                  get_scheduler_profile(e.scheduler_profile).free_uncached_first)
    link, model, tp = get_link(offload.link), config.deployment.model, config.deployment.tensor_parallel_size
    hook = ReloadPricing(lambda n: link.transfer_time_s(kv_transfer_bytes(model, n * e.block_size), tp),
                         e.check_invariants)
    engine = Engine(e, build_cost_model(config.deployment, e), blocks, hooks=[*speculation_hooks(config), hook], kv=kv)
    proc = EngineProcess(simpy.Environment(), engine)
    results = serve(config, proc, workload, until, {"offload": {"num_cpu_blocks": kv.num_cpu_blocks, "link": link.name}})
    results.summary.update(tier_summary(kv, hook, results.requests["num_prompt_tokens"].sum()))
    return results


def tier_summary(kv: CPUOffloadKVCacheManager, hook: ReloadPricing, prompt_tokens: int) -> dict:
    """Hit rate per tier (cached tokens / prompt tokens), blocks moved each way, seconds of reloads."""
    return {"gpu_prefix_hit_rate": kv.gpu_hit_tokens / prompt_tokens if prompt_tokens else 0.0,
            "cpu_prefix_hit_rate": kv.cpu_hit_tokens / prompt_tokens if prompt_tokens else 0.0,
            "cpu_offloaded_blocks": kv.num_offloaded_blocks, "cpu_loaded_blocks": kv.num_loaded_blocks,
            "cpu_load_s": hook.load_s}
