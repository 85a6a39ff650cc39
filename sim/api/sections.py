"""A simulation's config sections and how they are read: deployment and workload, the TOML reader,
and the section builder that names a bad field by its TOML path (`within`).

`SimulationConfig` (sim.api.simulator) holds these with the engine, SLO and client sections.
"""
from __future__ import annotations

import dataclasses
import tomllib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kernels_cost_model.errors import ConfigError, require, require_path
from sim.api.client import ClientConfig
from sim.api.slo import SLOConfig
from sim.api.validation import check_deployment, check_workload
from sim.core.config import EngineConfig


@dataclass(frozen=True)
class DeploymentConfig:
    """Model, GPU and parallelism; how the step time and the KV-cache size are found.

    cost_model: "roofline" (calibrated per-operator model) or "linear" (sim.core.cost defaults).
    cpu_gpu_overlap: the engine's CPU work for the next step hides behind this step's GPU work, so a step
        lasts max(GPU, CPU) rather than GPU + CPU (None: as the engine schedules, overlapped under vLLM's
        async scheduling, its default; `engine.async_scheduling` decides the schedule itself).
    collective_scale: multiplier on collective times, in (0, 100] (1 = the measured microbenchmarks;
        roofline only).
    cpu_per_request_s: engine time per scheduled request per step (None = the cost model's default).
    kv_cache_dtype: "auto" (the model's dtype) or "fp8" (vLLM's --kv-cache-dtype fp8: one byte per value).
    cudagraph_memory_gib: CUDA-graph memory per GPU taken from the KV cache (0: none; vLLM 0.21 and later
        subtract their estimate, logged as "CUDA graph pool memory: ... (estimated)": set it to that).
    enable_expert_parallel: shard a MoE model's experts over the TP ranks instead of splitting each one
        (vLLM's --enable-expert-parallel; no effect on a dense model).
    data_parallel_size: DP ranks (vLLM's --data-parallel-size), each its own engine and KV cache; above 1
        it needs a MoE model with enable_expert_parallel, TP 1 and the roofline cost model: the ranks step
        in lockstep through the expert exchange (sim.api.data_parallel).
    interconnect: "auto" (the GPU catalog's link), "nvlink" or "pcie": how the host's GPUs talk, which
        prices the collectives (kernels_cost_model/interconnect.py; roofline only).
    calibration: "default" (the one shipped for the GPU), a named shipped variant such as
        "rtx-pro-6000@vllm-0.19", or a calibration JSON file (roofline only).
    clocks: "burst" (the kernel tables' clocks, the default) or "sustained" (a GPU kept at its power cap
        by compute-heavy work, as offline batches or long prompts under load: compute at the clock the cap
        holds, where that was measured: H100 SXM, H200; kernels_cost_model/power_cap.py; roofline only).
    """

    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    cost_model: str = "roofline"
    cpu_gpu_overlap: bool | None = None
    collective_scale: float = 1.0
    cpu_per_request_s: float | None = None
    kv_cache_dtype: str = "auto"
    cudagraph_memory_gib: float = 0.0
    enable_expert_parallel: bool = False
    data_parallel_size: int = 1
    calibration: str = "default"
    interconnect: str = "auto"
    clocks: str = "burst"

    def __post_init__(self) -> None:
        check_deployment(self)


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
        check_workload(self)

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
            from workloads.traces import require_trace_file
            require_trace_file("workload.path", self.path)
            trace = w.TraceWorkload(self.path, self.format, target_rate=self.target_rate,
                                    max_requests=self.num_requests, **common)
            if self.target_rate is not None:
                trace.scale()  # a trace that cannot be rescaled is this section's error, before the run
            return trace
        if self.kind == "closed_loop":
            return w.ClosedLoopClients(self.num_users, self.num_requests, self.lengths,
                                       think_time=self.think_time_s, **common)
        return w.SessionWorkload(self.num_requests, session_arrivals=w.Poisson(self.rate),
                                 think_time=self.think_time_s, eos_token_id=eos_token_id,
                                 max_model_len=max_model_len)


def read_toml(path: str | Path) -> dict:
    """A TOML file as a dict; a missing, unreadable, binary, malformed or empty file is a ConfigError.
    A leading UTF-8 byte order mark (as some Windows editors write) is skipped."""
    path = require_path("config", path, "a TOML file")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise ConfigError("config", str(path), "file not found") from None
    except IsADirectoryError:
        raise ConfigError("config", str(path), "is a folder, not a TOML file") from None
    except OSError as exc:
        raise ConfigError("config", str(path), f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError("config", str(path), f"not a text file (byte {exc.start} is not UTF-8)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(path), f"not valid TOML: {exc}") from None
    require(len(data) > 0, "config", str(path), "sets nothing (the file is empty); give at least one setting")
    return data


OTHER_COMMANDS_SECTIONS = {"sweep": "servesim sweep", "search": "servesim capacity", "target": "servesim capacity",
                           "prices": "servesim capacity", "disaggregation": "servesim disagg"}
"""Sections of the other commands' TOML files, named when such a file reaches the wrong command."""

SECTIONS = {"engine": EngineConfig, "deployment": DeploymentConfig, "workload": WorkloadConfig,
            "slo": SLOConfig, "client": ClientConfig}
"""SimulationConfig's sections: each given as its dataclass or as a dict of its settings."""


def as_section(name: str, kind: type, value):
    """`value` as section `kind`: the dataclass itself, or built from a dict of its settings."""
    if isinstance(value, kind):
        return value
    if isinstance(value, dict):
        return build_section(name, kind, value)
    raise ConfigError(name, value, f"must be {kind.__name__}(...) or a dict of its settings")


def build_section(name: str, kind: type, values: dict):
    if not isinstance(values, dict):
        raise ConfigError(name, values, "must be a table of settings")
    known = {f.name for f in dataclasses.fields(kind)}
    if kind is DeploymentConfig and "async_scheduling" in values:
        raise ConfigError("deployment.async_scheduling", values["async_scheduling"],
                          "renamed deployment.cpu_gpu_overlap (CPU time hidden behind GPU time; unset, it "
                          "follows engine.async_scheduling, which decides the schedule)")
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
