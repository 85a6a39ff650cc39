"""CPU KV offload for one engine: a host-memory tier under the GPU prefix cache, priced by its link.

    from sim.planning.offload import OffloadConfig, simulate_offload
    results = simulate_offload(config, OffloadConfig(cpu_bytes=64e9, link="pcie5"))
    results.summary["gpu_prefix_hit_rate"], results.summary["cpu_prefix_hit_rate"]

The tier (sim.core.kv_offload) keeps every full block the engine computes (write-through, as
vLLM 0.19's offloading connector); a request whose prefix hits there loads those blocks while the
other requests run, and computes once they land. Copies are priced per block
(kernels_cost_model.host_copies: measured on PCIe 5; each GPU moves its own KV shard over its own
link). Size: `cpu_bytes` of host memory (vLLM's `kv_offloading_size`, all GPUs together) or
`num_cpu_blocks` directly.
"""
from __future__ import annotations

from dataclasses import dataclass

import simpy

from kernels_cost_model.errors import ConfigError, require
from kernels_cost_model.host_copies import HostCopies, host_copies
from kernels_cost_model.kv_memory import kv_bytes_per_token
from kernels_cost_model.models import get_model
from kernels_cost_model.links import get_link
from sim.api.data_parallel import single_rank_only
from sim.api.results import Results
from sim.planning.engine_run import serve
from sim.api.cost_setup import build_cost_model
from sim.api.sections import within
from sim.api.simulator import SimulationConfig, check_names, resolve_kv_groups, resolve_num_gpu_blocks
from sim.api.spec_setup import speculation_hooks
from sim.core.fields import is_number
from sim.core.hooks import EngineHook
from sim.core.hybrid_switch import OFFLOADING
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

    def setting(self) -> tuple[str, object]:
        """(field, value) of the tier's size, for errors."""
        if self.cpu_bytes is not None:
            return "offload.cpu_bytes", self.cpu_bytes
        return "offload.num_cpu_blocks", self.num_cpu_blocks

    def cpu_blocks(self, config: SimulationConfig) -> int:
        """The tier's size in blocks; a tier smaller than one block is a named error."""
        block_bytes = tier_block_bytes(config)
        if self.num_cpu_blocks is not None:
            require(isinstance(self.num_cpu_blocks, int) and self.num_cpu_blocks >= 1, "offload.num_cpu_blocks",
                    self.num_cpu_blocks, "the CPU tier must hold at least one block")
            return self.num_cpu_blocks
        if self.cpu_bytes < block_bytes:
            raise ConfigError("offload.cpu_bytes", self.cpu_bytes,
                              f"smaller than one KV block ({block_bytes} bytes: {config.engine.block_size} tokens "
                              f"of {config.deployment.model})")
        return int(self.cpu_bytes // block_bytes)


def check_tier_layout(config: SimulationConfig, connectors, field: str, value) -> None:
    """ConfigError naming the tier's `field` where vLLM keeps its hybrid KV cache manager with the
    tier's connector (0.33: OffloadingConnector supports it): servesim's CPU tier holds one
    full-attention group only, so it cannot run the hybrid groups faithfully. Under 0.19 the
    connector turns the manager off (sim.core.hybrid_switch) and every layer is full attention."""
    if resolve_kv_groups(config, connectors) is None:
        return
    release = get_scheduler_profile(config.engine.scheduler_profile).release
    raise ConfigError(field, value, f"vLLM {release} keeps its hybrid KV cache manager for "
                      f"{config.deployment.model} with a CPU tier, and servesim's CPU tier holds only one "
                      "full-attention layer group; drop the tier or use scheduler_profile vllm-0.19 "
                      "(which turns the manager off with any KV connector)")


def tier_block_bytes(config: SimulationConfig) -> int:
    """Host bytes one block takes in the tier, all GPUs together, as vLLM sizes it (page bytes x KV tensors
    x world size): a GPU's share of a block's KV (KV dtype, replicated KV heads) times the TP ranks."""
    d = config.deployment
    per_gpu = kv_bytes_per_token(d.model, d.tensor_parallel_size, d.kv_cache_dtype) * config.engine.block_size
    return per_gpu * d.tensor_parallel_size


class OffloadTransfers(EngineHook):
    """Times the CPU tier's copies (sim.core.kv_offload) as vLLM 0.19's offloading connector runs them.

    - A load starts with the first step planned after its request parks (or when the host-to-device
      copies before it end) and runs beside the steps; the request waits for it: at the end of the
      first step that ends after the load lands, it returns to the front of the waiting queue.
    - A step's stores start after its compute (or when the device-to-host copies before them end).
    - A finished request that stored blocks holds its GPU blocks until its stores landed and a step
      planned after its finish ended (the step that tells the workers it finished).
    - With no request running and copies in flight the engine waits for the next to land (an empty step).
    """

    def __init__(self, copies: HostCopies, copy_bytes: float, check: bool, starts_when_planned: bool = False,
                 copies_per_block: int = 1, stages: tuple[tuple[float, int], ...] | None = None):
        self.copies, self.check = copies, check
        #: (bytes per copy, copies per block) of each pipeline stage's GPUs: one per block (all the stage's
        #: layers) or one per layer; each stage copies over its own links, beside the others
        self.stages = stages or ((copy_bytes, copies_per_block),)
        self.starts_when_planned = starts_when_planned   # (pipeline stages: a batch enters when planned)
        self.load_s = self.store_s = 0.0
        self.h2d_free = [0.0] * len(self.stages)   # when each stage's copies in that direction end
        self.d2h_free = [0.0] * len(self.stages)
        self.gpu_free = 0.0
        self.load_end: dict = {}        # parked request -> when its load lands
        self.store_end: dict = {}       # request -> when its last store lands
        self.finished_after: dict = {}  # finished request -> steps planned when it finished
        self.planned = self.ended = 0
        self.kv = self.state = None

    def on_attach(self, engine) -> None:
        self.kv, self.state = engine.state.kv, engine.state

    def has_work(self) -> bool:
        """A load to issue: a plan parked a request and scheduled nothing (async scheduling, the running
        requests' last tokens in flight), and vLLM's connector starts the load in a step with no forward
        pass (`kv_connector_no_forward`). Or copies in flight that nothing else would wait for: no request
        runs (running ones step anyway, and under pipeline stages an empty batch would take a stage's slot)."""
        kv = self.kv
        if kv.parked and any(req not in self.load_end for req in kv.parked):
            return True
        return bool(kv.parked or kv.finished) and not self.state.running

    def _copy(self, blocks: int, direction: str, start: float) -> tuple[float, float]:
        """(when a transfer of `blocks` issued at `start` lands, its seconds): each stage copies its own
        layers' share after its copies before it in that direction, and the transfer lands with the
        last stage's; its seconds are the longest stage's."""
        free = self.h2d_free if direction == "h2d" else self.d2h_free
        landed = longest = 0.0
        for i, (copy_bytes, per_block) in enumerate(self.stages):
            seconds = self.copies.seconds(blocks * per_block, copy_bytes, direction)
            free[i] = max(start, free[i]) + seconds
            landed, longest = max(landed, free[i]), max(longest, seconds)
        return landed, longest

    def on_plan(self, engine, step) -> None:
        self.planned += 1
        start = step.start if self.starts_when_planned else max(step.start, self.gpu_free)
        for req, hashes in self.kv.parked.items():
            if req not in self.load_end:
                self.load_end[req], seconds = self._copy(len(hashes), "h2d", start)
                self.load_s += seconds
        if not step.plan.scheduled:
            step.duration += max(0.0, self._next_landing(start) - start)
        end = start + step.duration
        for req, blocks in self.kv.prepare_stores(step.plan.scheduled):
            self.store_end[req], seconds = self._copy(blocks, "d2h", end)
            self.store_s += seconds
        self.gpu_free = end

    def _next_landing(self, now: float) -> float:
        """When the next load or store the engine waits for lands (`now` if one has already)."""
        times = [self.load_end[r] for r in self.kv.parked] + [self.store_end.get(r, now) for r in self.kv.finished]
        return max(now, min(times)) if times else now

    def on_step_end(self, engine, now: float) -> None:
        self.ended += 1
        kv = self.kv
        landed = [r for r in kv.parked if self.load_end[r] <= now]
        for req in landed:
            kv.finish_load(req)
            del self.load_end[req]
        for req in reversed(landed):
            engine.state.waiting.appendleft(req)
        for req in list(self.load_end):
            if req not in kv.parked:    # aborted while loading
                del self.load_end[req]
        for req in list(kv.finished):
            after = self.finished_after.setdefault(req, self.planned)
            if self.ended > after and self.store_end.get(req, now) <= now:
                kv.release(req)
                del self.finished_after[req]
                self.store_end.pop(req, None)
        if not self.ended % 1024:   # requests whose stores landed at a preemption and that left since
            self.store_end = {r: t for r, t in self.store_end.items() if r in kv.storing or r in kv.finished}
        if self.check:
            check_cpu_tier(kv)


def simulate_offload(config: SimulationConfig, offload: OffloadConfig, *, workload=None,
                     until: float | None = None) -> Results:
    """One engine with a CPU KV tier serving config.workload (or `workload`)."""
    single_rank_only(config.deployment, "KV offloading")
    check_names(config.engine)
    e = config.engine
    check_tier_layout(config, (OFFLOADING,), *offload.setting())
    blocks = check_kv_capacity(resolve_num_gpu_blocks(config, (OFFLOADING,)), e)
    kv = CPUOffloadKVCacheManager(blocks, e.block_size, e.enable_prefix_caching, offload.cpu_blocks(config),
                                  get_scheduler_profile(e.scheduler_profile).free_uncached_first)
    hook = offload_transfers(config, offload)
    engine = Engine(e, build_cost_model(config.deployment, e, config.speculative_config), blocks,
                    hooks=[*speculation_hooks(config), hook], kv=kv)
    proc = EngineProcess(simpy.Environment(), engine)
    results = serve(config, proc, workload, until, {"offload": {"num_cpu_blocks": kv.num_cpu_blocks,
                                                                "link": hook.copies.link.name}})
    results.summary.update(tier_summary(kv, hook, results.requests["num_prompt_tokens"].sum()))
    return results


def offload_transfers(config: SimulationConfig, offload: OffloadConfig, *, starts_when_planned: bool = False,
                      layer_partition: tuple[int, ...] | None = None) -> OffloadTransfers:
    """The hook timing `offload`'s copies for `config`'s model, as the scheduler profile's release
    issues them, the GPUs over their own links at once: vLLM 0.19 lays the cache out across layers
    for its connector (one copy of all a block's layers on a GPU), 0.33 copies each layer's page of
    a block apart, batched. `starts_when_planned`: a step starts when it is planned (pipeline
    stages), else when the one planned before it ends. `layer_partition` (pipeline stages): each
    stage's GPUs copy only their layers' pages of a block (every PP rank runs its own offloading
    worker on its own layers' KV), so a stage of n of L layers moves n/L of a block's bytes."""
    d, e = config.deployment, config.engine
    block_bytes = kv_bytes_per_token(d.model, d.tensor_parallel_size, d.kv_cache_dtype) * e.block_size
    release = get_scheduler_profile(e.scheduler_profile).release
    num_layers = get_model(d.model).num_layers
    per_block = 1 if release == "0.19" else num_layers
    copies = host_copies(offload.link, release)
    if layer_partition is None or len(layer_partition) == 1:
        return OffloadTransfers(copies, block_bytes / per_block, e.check_invariants, starts_when_planned, per_block)
    return OffloadTransfers(copies, 0.0, e.check_invariants, starts_when_planned,
                            stages=stage_copies(block_bytes, num_layers, layer_partition, release))


def stage_copies(block_bytes: int, num_layers: int, layer_partition: tuple[int, ...],
                 release: str) -> tuple[tuple[float, int], ...]:
    """(bytes per copy, copies per block) on each stage's GPUs, whose pages of a block are its n
    layers' share of `block_bytes` (one GPU's bytes of a block, all layers): vLLM 0.19 copies them in
    one (block_bytes x n / L), 0.33 one per layer (n copies of block_bytes / L)."""
    if release == "0.19":
        return tuple((block_bytes * n / num_layers, 1) for n in layer_partition)
    return tuple((block_bytes / num_layers, n) for n in layer_partition)


def tier_summary(kv: CPUOffloadKVCacheManager, hook: OffloadTransfers, prompt_tokens: int) -> dict:
    """Hit rate per tier (cached tokens / prompt tokens), blocks moved each way, seconds of copies."""
    return {"gpu_prefix_hit_rate": kv.gpu_hit_tokens / prompt_tokens if prompt_tokens else 0.0,
            "cpu_prefix_hit_rate": kv.cpu_hit_tokens / prompt_tokens if prompt_tokens else 0.0,
            "cpu_offloaded_blocks": kv.num_offloaded_blocks, "cpu_loaded_blocks": kv.num_loaded_blocks,
            "cpu_load_s": hook.load_s, "cpu_store_s": hook.store_s}
