"""The public entry point: a SimulationConfig in, Results out.

    from sim import SimulationConfig, simulate
    results = simulate(SimulationConfig())          # Llama-3.1-8B, one H100, ShareGPT-like Poisson
    print(results.summary["p99_ttft_ms"])

A config is four frozen sections (engine, deployment, workload, slo), a seed, an optional
`speculative_config` (vLLM's name; see sim.core.speculative) and an optional `client` (latency an HTTP
client adds to the results, sim.api.client); it reads from a
TOML file with the same section and key names (`SimulationConfig.from_toml`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from sim.core.config import AUTO_MAX_MODEL_LEN, MAX_NUM_GPU_BLOCKS, EngineConfig
from kernels_cost_model.errors import ConfigError, require
from sim.api.client import ClientConfig
from sim.api.cost_setup import build_cost_model, describe_cost_model
from sim.api.memory import keep_large_blocks_apart, release_freed_memory
from sim.api.results import Results
from sim.api.sections import (OTHER_COMMANDS_SECTIONS, SECTIONS, DeploymentConfig, WorkloadConfig, as_section,
                              build_section, read_toml, within)
from sim.api.slo import SLOConfig
from sim.api.version import __version__
from sim.api.validation import (check_kv_holds_one_request, check_model_limits,
                                check_simulation, check_step_budget,
                                resolve_engine, switch_kind, unresolved_engine_values, warn_length_cuts,
                                warn_rejections)
from sim.api.spec_setup import build_spec_decoder, check_mtp_layers, check_speculative, spec_num_gpu_blocks
from sim.api.data_parallel import check_data_parallel, run_lockstep
from sim.api.results import merge_results
from sim.core.hybrid_switch import run_layout
from sim.core.kv_groups import window_budget_tokens
from sim.core.kv_mamba_align import runs_mamba_align
from sim.core.speculative import SpeculativeConfig
from sim.core.text import check_token_text
from sim.engine.engine import Engine
from sim.engine.simulation import check_progress, check_traffic, check_until, run_engine


@dataclass(frozen=True)
class SimulationConfig:
    """Everything one simulation needs. Same config and seed give identical results. Each section is its
    dataclass or a dict of its settings, keyed as in TOML (`SimulationConfig(slo={"ttft_s": 0.5})`)."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    seed: int = 0
    speculative_config: SpeculativeConfig | None = None  # vLLM's name; None: no speculative decoding
    client: ClientConfig = field(default_factory=ClientConfig)  # HTTP client's added latency (results only)

    def __post_init__(self) -> None:
        for name, kind in SECTIONS.items():
            object.__setattr__(self, name, as_section(name, kind, getattr(self, name)))
        object.__setattr__(self, "speculative_config", SpeculativeConfig.from_dict(self.speculative_config))
        given = self.engine
        self.__dict__.setdefault("_given_block_size", given.block_size)
        object.__setattr__(self, "engine", resolve_engine(given, self.deployment))
        check_simulation(self)
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "engine", check_speculative(self.speculative_config, self.engine))
        if given.max_model_len == AUTO_MAX_MODEL_LEN:
            self._fit_max_model_len(given)
        check_mtp_layers(self.speculative_config, self.deployment)
        check_data_parallel(self.deployment, self.speculative_config)

    @property
    def given_block_size(self) -> int:
        """The block size asked for; `engine.block_size` is the one run, raised for a model with
        linear-attention state as vLLM raises it (sim.api.validation.with_hybrid_block_size)."""
        return self.__dict__.get("_given_block_size", self.engine.block_size)

    @property
    def auto_max_model_len(self) -> bool:
        """Whether max_model_len was asked for as auto (AUTO_MAX_MODEL_LEN) and fitted to the KV cache."""
        return self.__dict__.get("_auto_max_model_len", False)

    def _fit_max_model_len(self, given: EngineConfig) -> None:
        """vLLM's `--max-model-len auto`: the model's maximum, or, where the sized KV cache holds less, the
        longest one request it holds (vllm/v1/core/kv_cache_utils.py `_auto_fit_max_model_len`). The
        engine is then resolved again from `given` at that length."""
        object.__setattr__(self, "_auto_max_model_len", True)
        if self.engine.max_model_len is None:
            return  # an unknown model: simulate() names it
        fitted = longest_fitting_len(self)
        if fitted < self.engine.max_model_len:
            engine = resolve_engine(dataclasses.replace(given, max_model_len=fitted), self.deployment)
            object.__setattr__(self, "engine", check_speculative(self.speculative_config, engine))

    @classmethod
    def from_dict(cls, data: dict) -> "SimulationConfig":
        """Build from nested dicts keyed like the dataclasses; unknown keys are named errors."""
        require(isinstance(data, dict), "config", data, "must be a dict of sections (engine, workload, ...)")
        unknown = sorted(set(data) - set(SECTIONS) - {"seed", "speculative_config"})
        if unknown:
            name = unknown[0]
            command = OTHER_COMMANDS_SECTIONS.get(name)
            hint = f" ([{name}] is read by `{command} --config`, not here)" if command else ""
            raise ConfigError(name, data[name], f"unknown section{hint}; expected {sorted(SECTIONS)}, "
                                                "speculative_config or seed")
        kwargs = {name: build_section(name, kind, data.get(name, {})) for name, kind in SECTIONS.items()}
        return cls(**kwargs, seed=data.get("seed", 0),
                   speculative_config=SpeculativeConfig.from_dict(data.get("speculative_config")))

    @classmethod
    def from_toml(cls, path: str | Path) -> "SimulationConfig":
        """Read a TOML file with [engine], [deployment], [workload], [slo] sections and `seed`."""
        return cls.from_dict(read_toml(path))

    def replace(self, **sections) -> "SimulationConfig":
        """A copy with some sections or fields replaced, e.g. replace(workload={"rate": 20})."""
        updates = {}
        known = [f.name for f in dataclasses.fields(self)]
        for name, value in sections.items():
            require(name in known, name, value, f"unknown section; known: {known}")
            current = getattr(self, name)
            if name == "speculative_config":
                base = dataclasses.asdict(current) if current is not None and isinstance(value, dict) else {}
                value = SpeculativeConfig.from_dict({**base, **value} if isinstance(value, dict) else value)
            elif isinstance(value, dict):
                if name == "engine":
                    merged = {**unresolved_engine_values(self), **value}
                elif name == "workload":
                    merged = switch_kind(current, value)
                else:
                    merged = {**{f.name: getattr(current, f.name) for f in dataclasses.fields(current)}, **value}
                value = build_section(name, type(current), merged)
            updates[name] = value
        if "deployment" in updates and "engine" not in updates:
            updates["engine"] = build_section("engine", EngineConfig, unresolved_engine_values(self))
        replaced = dataclasses.replace(self, **updates)
        if "engine" not in updates:  # (the engine carried over is resolved: keep the size asked for)
            replaced.__dict__["_given_block_size"] = self.given_block_size
        return replaced


def resolve_num_gpu_blocks(config: SimulationConfig, connectors=()) -> int:
    """The engine's pinned KV size, or the one vLLM would size from the model and GPU memory (which
    must hold one max_model_len request, or vLLM does not start). `connectors`: the KV connectors
    (sim.core.hybrid_switch.NIXL, OFFLOADING) the topology adds, which may turn the hybrid manager off."""
    pinned = config.engine.num_gpu_blocks
    blocks = pinned if pinned is not None else _sized_num_gpu_blocks(config, connectors)
    layout = resolve_kv_layout(config, connectors)
    if pinned is None or (layout is not None and layout.is_hybrid):  # (a plain one: with the engine's config)
        check_kv_holds_one_request(config.engine, config.deployment, blocks, layout)
    return blocks


def longest_fitting_len(config: SimulationConfig) -> int:
    """The longest request (prompt + output tokens, at most the engine's max_model_len) whose KV the
    cache vLLM would size (or the pinned one) holds once, per layer group for a hybrid model; a named
    error where not even one token fits."""
    e, d = config.engine, config.deployment
    blocks = e.num_gpu_blocks or _sized_num_gpu_blocks(config)
    layout = resolve_kv_layout(config)

    def fits(length: int) -> bool:
        if layout is None:
            return blocks * e.block_size >= length
        return layout.vllm_max_concurrency(blocks, length, window_budget_tokens(e)) >= 1

    low, high = 0, e.max_model_len
    while low < high:  # the largest length that fits (fitting is monotone in the length)
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    require(low >= 1, "engine.max_model_len", AUTO_MAX_MODEL_LEN,
            f"auto: the KV cache of {d.model} on {d.gpu} holds not even one token; raise "
            "deployment.gpu_memory_utilization or tensor_parallel_size")
    return low


def _sized_num_gpu_blocks(config: SimulationConfig, connectors=()) -> int:
    from kernels_cost_model import get_gpu, get_model
    with within("deployment"):  # (named before the sizing reads the defaults an unknown GPU leaves unset)
        get_gpu(config.deployment.gpu), get_model(config.deployment.model)
    if config.deployment.data_parallel_size > 1:
        return require_bookable_blocks(_data_parallel_blocks(config), config)
    if config.speculative_config is not None:
        with within("deployment"):
            blocks = spec_num_gpu_blocks(config.speculative_config, config.deployment, config.engine,
                                         _hybrid_sizing_layout(config, connectors))
        return require_bookable_blocks(blocks, config)
    from kernels_cost_model import kv_cache_blocks
    d, e = config.deployment, config.engine
    layout = resolve_kv_layout(config, connectors)
    with within("deployment"):
        blocks = kv_cache_blocks(d.model, d.gpu, d.tensor_parallel_size, e.block_size,
                                 d.gpu_memory_utilization, e.max_num_batched_tokens, kv_cache_dtype=d.kv_cache_dtype,
                                 max_num_seqs=e.max_num_seqs,
                                 cudagraph_memory_bytes=round(d.cudagraph_memory_gib * 2**30),
                                 hybrid_manager=layout is None or layout.is_hybrid)
    return require_bookable_blocks(blocks, config)


def _hybrid_sizing_layout(config: SimulationConfig, connectors=()):
    """The run's layout (drafter layers and speculative state in it) where the target is a hybrid
    model, for sizing its pool as vLLM does; None for a plain target (sized per token)."""
    from kernels_cost_model import kv_layout
    d = config.deployment
    with within("deployment"):
        own = kv_layout(d.model, d.tensor_parallel_size, config.engine.block_size, d.kv_cache_dtype)
    return resolve_kv_layout(config, connectors) if own.is_hybrid else None


def require_bookable_blocks(blocks: int, config: SimulationConfig) -> int:
    """`blocks` (sized from GPU memory) if the engine can keep books for that many; else an error that
    names the block size, the setting that made them so many (num_gpu_blocks itself was not set)."""
    d, e = config.deployment, config.engine
    require(blocks <= MAX_NUM_GPU_BLOCKS, "engine.block_size", e.block_size,
            f"{d.model} on {d.gpu} leaves room for {blocks} KV blocks, more than the {MAX_NUM_GPU_BLOCKS}"
            " the engine keeps books for; use a larger block_size")
    return blocks


def _data_parallel_blocks(config: SimulationConfig) -> int:
    """KV blocks per DP rank of a MoE model with its experts spread over the ranks."""
    from kernels_cost_model.expert_parallel import ep_kv_cache_blocks
    d, e = config.deployment, config.engine
    with within("deployment"):
        return ep_kv_cache_blocks(d.model, d.gpu, d.data_parallel_size, e.block_size, d.gpu_memory_utilization,
                                  e.max_num_batched_tokens, d.kv_cache_dtype, max_num_seqs=e.max_num_seqs,
                                  cudagraph_memory_bytes=round(d.cudagraph_memory_gib * 2**30))


def resolve_kv_layout(config: SimulationConfig, connectors=(), *, speculative_state: bool = True):
    """The model's KV layout on one GPU as the run holds it (kernels_cost_model.kv_layout.KVCacheLayout):
    every layer as full attention where vLLM turns its hybrid manager off for `connectors` or the
    drafts (sim.core.hybrid_switch); with a speculative head (EAGLE, EAGLE-3, MTP) its attention layer
    grouped in, and (`speculative_state`) a state group's 1 + k states per request; None for a pinned
    cache under the linear cost model, which needs no real model."""
    from kernels_cost_model import kv_layout
    d = config.deployment
    try:
        with within("deployment"):
            layout = kv_layout(d.model, d.tensor_parallel_size, config.engine.block_size, d.kv_cache_dtype)
    except ConfigError:
        if d.cost_model == "linear" and config.engine.num_gpu_blocks is not None:
            return None
        raise
    spec = config.speculative_config
    layout = run_layout(layout, config.engine.scheduler_profile, connectors, spec.method if spec is not None else None)
    if spec is None:
        return layout.with_mamba_align() if runs_mamba_align(config.engine, layout.groups) else layout
    layout = layout.with_drafter_layers(drafter_kv_layers(spec.method))
    return layout.with_speculative_state(spec.num_speculative_tokens) if speculative_state else layout


def drafter_kv_layers(method: str) -> int:
    """Attention layers a drafter adds to the target's KV groups: one for an EAGLE, EAGLE-3 or MTP head
    (a full-attention layer of the target's shape; an MTP head drafting k tokens reuses its one layer);
    none for n-gram, and none counted for a separate draft model, whose KV is sized per token beside the
    target's (kernels_cost_model.speculative.proposer_kv_cache_blocks)."""
    from kernels_cost_model.speculative import HEAD_METHODS
    return 1 if method in HEAD_METHODS else 0


def resolve_kv_groups(config: SimulationConfig, connectors=()):
    """The model's KV layer groups when the run has several (hybrid manager), else None (plain manager)."""
    layout = resolve_kv_layout(config, connectors, speculative_state=False)  # (the spec hook adds them)
    return layout.groups if layout is not None and layout.is_hybrid else None


def kv_capacity_meta(config: SimulationConfig, num_gpu_blocks: int, connectors=()) -> dict:
    """What vLLM logs at start-up about the KV cache: its size in tokens and the concurrency of
    max_model_len requests, counted per layer group as its hybrid manager does."""
    layout, e = resolve_kv_layout(config, connectors), config.engine
    raised = {"block_size_asked": config.given_block_size} if config.given_block_size != e.block_size else {}
    if layout is None:
        return {"num_gpu_blocks": num_gpu_blocks, **raised}
    return {"num_gpu_blocks": num_gpu_blocks, "kv_cache_tokens": layout.tokens(num_gpu_blocks),
            "max_concurrency": layout.vllm_max_concurrency(num_gpu_blocks, e.max_model_len,
                                                           window_budget_tokens(e)), **raised}


def check_names(engine: EngineConfig) -> None:
    """Fail early, with the TOML path, on an unknown policy or stop profile."""
    from policies import get_policy
    from sim.core.stop_rules import get_profile
    with within("engine"):
        get_policy(engine.policy)
        get_profile(engine.stop_profile)


def simulate(config: SimulationConfig | None = None, *, workload=None, token_text=None,
             until: float | None = None, progress=None, cost_model=None) -> Results:
    """Run one simulation. `workload` overrides config.workload (any workload object, or a non-empty list
    of RequestSpecs).
    `cost_model`: a step-time model built by the caller, used instead of the deployment's (single
    replica only; the deployment still sizes the KV cache).

    `progress`: optional object with `update(now)`, called once per finished request
    (`sim.api.progress.Progress` prints simulated time and requests done to stderr).
    """
    config = config or SimulationConfig()
    require(isinstance(config, SimulationConfig), "config", config,
            "must be a SimulationConfig (SimulationConfig.from_dict builds one from a dict)")
    check_traffic(workload)
    check_until(until)
    check_progress(progress)
    check_token_text(token_text)
    check_names(config.engine)
    check_model_limits(config)
    check_step_budget(config.engine)
    traffic = workload
    if traffic is None:
        with within("workload"):
            traffic = config.workload.build(config.engine.eos_token_id, config.engine.max_model_len)
    if config.deployment.data_parallel_size > 1:
        require(cost_model is None, "cost_model", type(cost_model).__name__,
                "is for single-replica runs (deployment.data_parallel_size = 1)")
        return simulate_data_parallel(config, traffic, until=until, progress=progress)
    cost_model = cost_model or build_cost_model(config.deployment, config.engine, config.speculative_config)
    blocks = resolve_num_gpu_blocks(config)
    spec = config.speculative_config
    hooks = [build_spec_decoder(spec, config.deployment, config.seed)] if spec is not None else []
    keep_large_blocks_apart(_planned_requests(config, workload))
    records = run_engine(traffic, token_times_as_runs(config.engine), cost_model, blocks, seed=config.seed,
                         token_text=token_text, until=until, hooks=hooks,
                         progress=progress, kv_groups=resolve_kv_groups(config))
    release_freed_memory(len(records.requests))
    require(len(records.requests) > 0 or until is not None, "workload",
            workload if workload is not None else config.workload,
            "gave no requests: nothing to simulate (an empty iterator, num_requests=0, or a duration shorter"
            " than the first arrival)")
    meta = {"config": _plain(config), "cost_model": type(cost_model).__name__,
            "cost_model_description": describe_cost_model(cost_model), "servesim_version": __version__,
            **kv_capacity_meta(config, blocks)}
    results = Results.from_records(records, slo=config.slo.as_dict(), meta=meta).with_client_latency(config.client)
    warn_rejections(results.requests, config.engine.max_model_len, config.engine.refuses_over_length)
    warn_length_cuts(results.requests, config.engine.max_model_len)
    return results


def _planned_requests(config: SimulationConfig, workload) -> int | None:
    """How many requests the run will have, where that is known before it (None: not known)."""
    if workload is None:
        return config.workload.num_requests
    return len(workload) if hasattr(workload, "__len__") else None


def token_times_as_runs(engine: EngineConfig) -> EngineConfig:
    """The engine `simulate()` runs: token times kept (`record_token_times = true`) are kept as runs
    (sim.core.token_runs): `Results.token_times` reads back the same floats, and a run holds a few
    integers per request instead of 8 bytes a token (3.5 GB at a million ShareGPT requests)."""
    return dataclasses.replace(engine, record_token_times="runs") if engine.record_token_times is True else engine


def simulate_data_parallel(config: SimulationConfig, traffic, *, until=None, progress=None) -> Results:
    """DP ranks of a MoE model in lockstep (sim.api.data_parallel): one engine and KV cache per rank, the
    step priced by ExpertParallelCostModel; Results of all ranks merged (column `replica` = DP rank)."""
    from kernels_cost_model.expert_parallel import ExpertParallelCostModel
    d, e, dp = config.deployment, config.engine.resolved(), config.deployment.data_parallel_size
    with within("deployment"):
        cost = ExpertParallelCostModel(build_cost_model(d, config.engine), dp)
    blocks = e.num_gpu_blocks or _data_parallel_blocks(config)
    check_kv_holds_one_request(config.engine, d, blocks, resolve_kv_layout(config))
    groups = resolve_kv_groups(config)
    engines = [Engine(token_times_as_runs(e), cost.base, blocks, kv_groups=groups) for _ in range(dp)]
    records = run_lockstep(engines, cost, traffic, seed=config.seed, until=until, progress=progress)
    slo = config.slo.as_dict()
    meta = {"config": _plain(config), "cost_model": type(cost).__name__,
            "cost_model_description": describe_cost_model(cost.base), "servesim_version": __version__,
            "data_parallel_size": dp, "num_gpus": d.tensor_parallel_size * dp,
            **{k: v for k, v in kv_capacity_meta(config, blocks).items() if k != "num_gpu_blocks"}}  # per rank
    parts = [Results.from_records(r, slo=slo, meta=dict(meta, replica=i)) for i, r in enumerate(records)]
    results = merge_results(parts, slo, meta)
    results.summary.update(num_gpus=meta["num_gpus"], data_parallel_size=dp)
    results = results.with_client_latency(config.client)
    warn_rejections(results.requests, config.engine.max_model_len, config.engine.refuses_over_length)
    warn_length_cuts(results.requests, config.engine.max_model_len)
    return results


def _plain(config: SimulationConfig) -> dict:
    return dataclasses.asdict(config)
