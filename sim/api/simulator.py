"""The public entry point: a SimulationConfig in, Results out.

    from sim import SimulationConfig, simulate
    results = simulate(SimulationConfig())          # Llama-3.1-8B, one H100, ShareGPT-like Poisson
    print(results.summary["ttft_ms_p99"])

A config is four frozen sections (engine, deployment, workload, slo), a seed and an optional
`speculative_config` (vLLM's name; see sim.core.speculative); it reads from a
TOML file with the same section and key names (`SimulationConfig.from_toml`).
"""
from __future__ import annotations

import dataclasses
import tomllib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from kernels_cost_model.errors import ConfigError, require
from sim.api.results import Results
from sim.api.spec_setup import build_spec_decoder, check_speculative, spec_num_gpu_blocks
from sim.core.speculative import SpeculativeConfig
from sim.engine.simulation import run_engine

WORKLOAD_KINDS = ("poisson", "gamma", "trace", "closed_loop", "sessions")


@dataclass(frozen=True)
class DeploymentConfig:
    """Model, GPU and parallelism; how the step time and the KV-cache size are found.

    cost_model: "roofline" (calibrated per-operator model) or "linear" (sim.core.cost defaults).
    async_scheduling: vLLM's async scheduling (the engine's CPU work hides behind the GPU step).
    collective_scale: multiplier on collective times (1 = the measured microbenchmarks; roofline only).
    cpu_per_request_s: engine time per scheduled request per step (None = the cost model's default).
    """

    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    cost_model: str = "roofline"
    async_scheduling: bool = False
    collective_scale: float = 1.0
    cpu_per_request_s: float | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.tensor_parallel_size, int) and self.tensor_parallel_size >= 1,
                "deployment.tensor_parallel_size", self.tensor_parallel_size, "must be an integer >= 1")
        require(0 < self.gpu_memory_utilization <= 1, "deployment.gpu_memory_utilization",
                self.gpu_memory_utilization, "must be in (0, 1]")
        require(self.cost_model in ("roofline", "linear"), "deployment.cost_model", self.cost_model,
                "must be 'roofline' or 'linear'")
        require(isinstance(self.async_scheduling, bool), "deployment.async_scheduling", self.async_scheduling,
                "must be true or false")
        require(isinstance(self.collective_scale, (int, float)) and self.collective_scale > 0,
                "deployment.collective_scale", self.collective_scale, "must be a number > 0")
        require(self.cpu_per_request_s is None or (isinstance(self.cpu_per_request_s, (int, float))
                                                   and 0 <= self.cpu_per_request_s < 1),
                "deployment.cpu_per_request_s", self.cpu_per_request_s, "must be null or a number of seconds in [0, 1)")


@dataclass(frozen=True)
class WorkloadConfig:
    """The traffic. kind: poisson | gamma (needs cv) | trace (needs path) | closed_loop (needs
    num_users) | sessions (multi-turn chat; num_requests = sessions, rate = session starts/s)."""

    kind: str = "poisson"
    rate: float = 5.0
    num_requests: int = 1000
    lengths: str = "sharegpt"
    cv: float | None = None
    path: str | None = None
    format: str | None = None
    target_rate: float | None = None
    num_users: int | None = None
    think_time_s: float = 0.0
    max_tokens: int | None = None
    ignore_eos: bool = True
    shared_prefix_len: int = 0

    def __post_init__(self) -> None:
        require(self.kind in WORKLOAD_KINDS, "workload.kind", self.kind, f"must be one of {WORKLOAD_KINDS}")
        require(self.rate > 0, "workload.rate", self.rate, "must be > 0")
        require(isinstance(self.num_requests, int) and self.num_requests >= 1, "workload.num_requests",
                self.num_requests, "must be an integer >= 1")
        require(self.kind != "gamma" or self.cv is not None, "workload.cv", self.cv, "gamma arrivals need cv")
        require(self.kind != "trace" or self.path is not None, "workload.path", self.path, "trace needs a path")
        require(self.kind != "closed_loop" or self.num_users is not None, "workload.num_users",
                self.num_users, "closed_loop needs num_users")

    def build(self, eos_token_id: int, max_model_len: int):
        """The workload object this config describes."""
        import workloads as w
        common = dict(max_tokens=self.max_tokens, ignore_eos=self.ignore_eos)
        if self.kind == "poisson":
            return w.poisson_workload(self.rate, self.num_requests, self.lengths,
                                      shared_prefix_len=self.shared_prefix_len, **common)
        if self.kind == "gamma":
            return w.gamma_workload(self.rate, self.cv, self.num_requests, self.lengths,
                                    shared_prefix_len=self.shared_prefix_len, **common)
        if self.kind == "trace":
            require(Path(self.path).is_file(), "workload.path", self.path, "trace file not found")
            return w.TraceWorkload(self.path, self.format, target_rate=self.target_rate,
                                   max_requests=self.num_requests, **common)
        if self.kind == "closed_loop":
            return w.ClosedLoopClients(self.num_users, self.num_requests, self.lengths,
                                       think_time=self.think_time_s, **common)
        return w.SessionWorkload(self.num_requests, session_arrivals=w.Poisson(self.rate),
                                 think_time=self.think_time_s, eos_token_id=eos_token_id,
                                 max_model_len=max_model_len)


@dataclass(frozen=True)
class SLOConfig:
    """Latency targets for goodput and SLO attainment (None: not constrained)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class SimulationConfig:
    """Everything one simulation needs. Same config and seed give identical results."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    seed: int = 0
    speculative_config: SpeculativeConfig | None = None  # vLLM's name; None: no speculative decoding

    def __post_init__(self) -> None:
        require(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "must be an integer >= 0")
        object.__setattr__(self, "speculative_config", SpeculativeConfig.from_dict(self.speculative_config))
        object.__setattr__(self, "engine", check_speculative(self.speculative_config, self.engine))

    @classmethod
    def from_dict(cls, data: dict) -> "SimulationConfig":
        """Build from nested dicts keyed like the dataclasses; unknown keys are named errors."""
        sections = {"engine": EngineConfig, "deployment": DeploymentConfig,
                    "workload": WorkloadConfig, "slo": SLOConfig}
        unknown = set(data) - set(sections) - {"seed", "speculative_config"}
        if unknown:
            raise ConfigError(sorted(unknown)[0], data[sorted(unknown)[0]],
                              f"unknown section; expected {sorted(sections)}, speculative_config or seed")
        kwargs = {name: _section(name, kind, data.get(name, {})) for name, kind in sections.items()}
        return cls(**kwargs, seed=data.get("seed", 0),
                   speculative_config=SpeculativeConfig.from_dict(data.get("speculative_config")))

    @classmethod
    def from_toml(cls, path: str | Path) -> "SimulationConfig":
        """Read a TOML file with [engine], [deployment], [workload], [slo] sections and `seed`."""
        return cls.from_dict(read_toml(path))

    def replace(self, **sections) -> "SimulationConfig":
        """A copy with some sections or fields replaced, e.g. replace(workload={"rate": 20})."""
        updates = {}
        for name, value in sections.items():
            current = getattr(self, name)
            if name == "speculative_config":
                base = dataclasses.asdict(current) if current is not None and isinstance(value, dict) else {}
                value = SpeculativeConfig.from_dict({**base, **value} if isinstance(value, dict) else value)
            elif isinstance(value, dict):
                values = {f.name: getattr(current, f.name) for f in dataclasses.fields(current)}
                value = _section(name, type(current), {**values, **value})
            updates[name] = value
        return dataclasses.replace(self, **updates)


def read_toml(path: str | Path) -> dict:
    """A TOML file as a dict; a missing or malformed file is a ConfigError naming it."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("config", str(path), "file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(path), f"not valid TOML: {exc}") from None


def _section(name: str, kind: type, values: dict):
    if not isinstance(values, dict):
        raise ConfigError(name, values, "must be a table of settings")
    known = {f.name for f in dataclasses.fields(kind)}
    for key in values:
        if key not in known:
            raise ConfigError(f"{name}.{key}", values[key], f"unknown setting; known: {sorted(known)}")
    try:
        with within(name):
            return kind(**values)
    except TypeError as exc:
        raise ConfigError(name, values, str(exc)) from None


@contextmanager
def within(section: str):
    """Name a ConfigError about a bare field by its TOML path: max_num_seqs -> engine.max_num_seqs."""
    try:
        yield
    except ConfigError as exc:
        if "." in exc.field or exc.field in ("config", "seed"):
            raise
        raise ConfigError(f"{section}.{exc.field}", exc.value, exc.reason) from None


def build_cost_model(deployment: DeploymentConfig):
    """The step-time model a deployment asks for."""
    if deployment.cost_model == "linear":
        return LinearCostModel()
    from kernels_cost_model import make_cost_model
    with within("deployment"):
        return make_cost_model(deployment.model, deployment.gpu, deployment.tensor_parallel_size,
                               async_scheduling=deployment.async_scheduling,
                               collective_scale=deployment.collective_scale,
                               cpu_per_request_s=deployment.cpu_per_request_s)


def resolve_num_gpu_blocks(config: SimulationConfig) -> int:
    """The engine's pinned KV size, or the one vLLM would size from the model and GPU memory."""
    if config.engine.num_gpu_blocks is not None:
        return config.engine.num_gpu_blocks
    if config.speculative_config is not None:
        with within("deployment"):
            return spec_num_gpu_blocks(config.speculative_config, config.deployment, config.engine)
    from kernels_cost_model import kv_cache_blocks
    d, e = config.deployment, config.engine
    with within("deployment"):
        return kv_cache_blocks(d.model, d.gpu, d.tensor_parallel_size, e.block_size,
                               d.gpu_memory_utilization, e.max_num_batched_tokens)


def check_names(engine: EngineConfig) -> None:
    """Fail early, with the TOML path, on an unknown policy or stop profile."""
    from policies import get_policy
    from sim.core.stop_rules import get_profile
    with within("engine"):
        get_policy(engine.policy)
        get_profile(engine.stop_profile)


def simulate(config: SimulationConfig | None = None, *, workload=None, token_text=None,
             until: float | None = None, progress=None) -> Results:
    """Run one simulation. `workload` overrides config.workload (any workload object or spec list).

    `progress`: optional object with `update(now)`, called once per finished request
    (`sim.api.progress.Progress` prints simulated time and requests done to stderr).
    """
    config = config or SimulationConfig()
    check_names(config.engine)
    cost_model = build_cost_model(config.deployment)
    blocks = resolve_num_gpu_blocks(config)
    traffic = workload
    if traffic is None:
        with within("workload"):
            traffic = config.workload.build(config.engine.eos_token_id, config.engine.max_model_len)
    spec = config.speculative_config
    hooks = [build_spec_decoder(spec, config.deployment, config.seed)] if spec is not None else []
    records = run_engine(traffic, config.engine, cost_model, blocks, seed=config.seed,
                         token_text=token_text, until=until, hooks=hooks,
                         progress=progress)
    meta = {"config": _plain(config), "cost_model": type(cost_model).__name__}
    return Results.from_records(records, slo=config.slo.as_dict(), meta=meta)


def _plain(config: SimulationConfig) -> dict:
    return dataclasses.asdict(config)
