"""Configuration of prefill/decode disaggregation: two pools of instances and the link between them.

    [disaggregation]              # beside [engine], [deployment], [workload], [slo] in one TOML file
    link = "ib-ndr"               # kernels_cost_model/data/links.csv: nvlink4, pcie5, ib-ndr, roce-100g, ...
    first_token = "decode"        # the client's first token: "decode" (vLLM's proxy) or "prefill"
    abort_in_transfer = "wait"    # an abort with KV on the link: "wait" for it to land (vLLM) or "cancel" it
    [disaggregation.prefill]
    num_instances = 2
    tensor_parallel_size = 1      # default: the deployment's
    router = "least_outstanding"  # sim.planning.routers
    engine = { max_num_batched_tokens = 16384 }
    [disaggregation.decode]
    num_instances = 1
    engine = { max_num_seqs = 512 }
    pipeline_parallel_size = 2    # PP stages per instance (default 1), over pipeline_link (nvlink4)
    pipeline_layer_partition = [16, 16]  # layers per stage (vLLM's VLLM_PP_LAYER_PARTITION; default vLLM's own)
    kv_offloading_size = 64       # GiB CPU KV tier per instance (default none), over kv_offloading_link (pcie5)

Each instance is one engine on `tensor_parallel_size` GPUs of the deployment's GPU (or the pool's
`gpu`). `engine` overrides the shared [engine] settings for that pool; `block_size` and
`max_model_len` stay shared (a transferred block must mean the same tokens on both sides), and so does
`usage_context` (both pools serve the proxy's requests through the same kind of front end, which refuses
the same over-long requests).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from kernels_cost_model.errors import ConfigError, require
from kernels_cost_model.links import get_link
from sim.api.sections import build_section as section, read_toml, within
from sim.api.simulator import SimulationConfig
from sim.planning.disagg_aborts import ABORT_IN_TRANSFER
from sim.planning.first_token import FIRST_TOKEN
from sim.planning.instances import InstanceShape
from sim.core.fields import is_int
from sim.planning.offload import OffloadConfig, check_offloading_size
from sim.planning.pipeline import PipelineConfig
from sim.planning.routers import ROUTERS

SHARED_ENGINE_KEYS = ("block_size", "max_model_len", "usage_context")


@dataclass(frozen=True)
class PoolConfig:
    """One pool (prefill or decode): how many instances, their parallelism, router and engine flags."""

    num_instances: int = 1
    tensor_parallel_size: int | None = None
    gpu: str | None = None
    router: str = "least_outstanding"
    engine: dict = field(default_factory=dict)
    pipeline_parallel_size: int = 1
    pipeline_link: str = "nvlink4"
    pipeline_layer_partition: tuple[int, ...] | None = None   # layers per stage; None: vLLM's partition
    kv_offloading_size: float | None = None   # GiB of host memory per instance (vLLM's name), None: no CPU tier
    kv_offloading_link: str = "pcie5"

    def __post_init__(self) -> None:
        require(is_int(self.num_instances) and self.num_instances >= 1, "num_instances",
                self.num_instances, "must be an integer >= 1")
        require(self.tensor_parallel_size is None or (is_int(self.tensor_parallel_size)
                                                      and self.tensor_parallel_size >= 1),
                "tensor_parallel_size", self.tensor_parallel_size, "must be an integer >= 1")
        require(self.router in ROUTERS, "router", self.router, f"must be one of {ROUTERS}")
        require(isinstance(self.engine, dict), "engine", self.engine, "must be a table of engine settings")
        for key in SHARED_ENGINE_KEYS:
            require(key not in self.engine, f"engine.{key}", self.engine.get(key),
                    "is shared by both pools; set it in [engine]")
        require(is_int(self.pipeline_parallel_size) and self.pipeline_parallel_size >= 1,
                "pipeline_parallel_size", self.pipeline_parallel_size, "must be an integer >= 1")
        self._check_idle_links()
        self.shape   # links and offload size checked now

    def _check_idle_links(self) -> None:
        """A link whose feature is off is still a known link (a typo is named), and one set to other than
        its default says that it changes nothing."""
        for key, default, used, needs in (
                ("pipeline_link", "nvlink4", self.pipeline_parallel_size > 1, "pipeline_parallel_size > 1"),
                ("kv_offloading_link", "pcie5", self.kv_offloading_size is not None, "kv_offloading_size")):
            value = getattr(self, key)
            try:
                get_link(value)
            except ConfigError as exc:
                raise ConfigError(key, value, exc.reason) from None
            if not used and value != default:
                warnings.warn(f"{key}={value!r} changes nothing without {needs}", stacklevel=4)

    @property
    def shape(self):
        """The instances' PP stages and CPU KV tier (sim.planning.instances)."""
        try:
            pipeline = (PipelineConfig(self.pipeline_parallel_size, self.pipeline_link, self.pipeline_layer_partition)
                        if self.pipeline_parallel_size > 1 else None)
        except ConfigError as exc:
            field = "pipeline_link" if exc.field == "pipeline.link" else "pipeline_layer_partition"
            raise ConfigError(field, exc.value, exc.reason) from None
        require(self.pipeline_layer_partition is None or pipeline is not None, "pipeline_layer_partition",
                self.pipeline_layer_partition, "needs pipeline_parallel_size > 1")
        if self.kv_offloading_size is None:
            return InstanceShape(pipeline, None, disaggregated=True)
        size = self.kv_offloading_size
        check_offloading_size("kv_offloading_size", size)
        try:
            return InstanceShape(pipeline, OffloadConfig(cpu_bytes=float(size) * 2**30, link=self.kv_offloading_link),
                                 disaggregated=True)
        except ConfigError as exc:
            raise ConfigError("kv_offloading_link", self.kv_offloading_link, exc.reason) from None

    def instance_config(self, base: SimulationConfig) -> SimulationConfig:
        """The simulation config of one instance of this pool."""
        deployment = {k: v for k, v in (("tensor_parallel_size", self.tensor_parallel_size),
                                         ("gpu", self.gpu)) if v is not None}
        return base.replace(deployment=deployment, engine=dict(self.engine))

    def num_gpus(self, base: SimulationConfig) -> int:
        tp = self.tensor_parallel_size or base.deployment.tensor_parallel_size
        return self.num_instances * tp * self.pipeline_parallel_size


@dataclass(frozen=True)
class DisaggConfig:
    """Prefill pool, decode pool and the link KV moves over (P:D ratio = the instance counts)."""

    prefill: PoolConfig = field(default_factory=PoolConfig)
    decode: PoolConfig = field(default_factory=PoolConfig)
    link: str = "ib-ndr"
    first_token: str = "decode"     # whose first token the client sees (sim.planning.first_token)
    abort_in_transfer: str = "wait"  # sim.planning.disagg_aborts.ABORT_IN_TRANSFER

    def __post_init__(self) -> None:
        get_link(self.link)
        require(self.first_token in FIRST_TOKEN, "first_token", self.first_token, f"must be one of {FIRST_TOKEN}")
        require(self.abort_in_transfer in ABORT_IN_TRANSFER, "abort_in_transfer", self.abort_in_transfer,
                f"must be one of {ABORT_IN_TRANSFER}")

    @property
    def ratio(self) -> str:
        return f"{self.prefill.num_instances}P:{self.decode.num_instances}D"

    @classmethod
    def from_dict(cls, data: dict) -> "DisaggConfig":
        """From the [disaggregation] table; unknown keys are named errors."""
        if not isinstance(data, dict):
            raise ConfigError("disaggregation", data, "must be a table")
        known = ("abort_in_transfer", "decode", "first_token", "link", "prefill")
        unknown = set(data) - set(known)
        if unknown:
            key = sorted(unknown)[0]
            raise ConfigError(f"disaggregation.{key}", data[key], f"unknown setting; known: {', '.join(known)}")
        pools = {name: _pool(name, data.get(name, {})) for name in ("prefill", "decode")}
        with within("disaggregation"):
            return cls(**pools, link=data.get("link", "ib-ndr"), first_token=data.get("first_token", "decode"),
                       abort_in_transfer=data.get("abort_in_transfer", "wait"))


def _pool(name: str, values) -> PoolConfig:
    path = f"disaggregation.{name}"
    try:
        return section(path, PoolConfig, values)
    except ConfigError as exc:
        if exc.field.startswith(path):
            raise
        raise ConfigError(f"{path}.{exc.field}", exc.value, exc.reason) from None


POOL_DEPLOYMENT_KEYS = {"deployment.gpu": "gpu", "deployment.tensor_parallel_size": "tensor_parallel_size"}
"""The deployment settings a [disaggregation.<pool>] table sets as keys of its own."""


def pool_field(pool: str, field: str) -> str:
    """An instance config's field named under the pool's TOML table: deployment.gpu -> disaggregation.decode.gpu,
    engine.max_num_seqs -> disaggregation.decode.engine.max_num_seqs."""
    return f"disaggregation.{pool}.{POOL_DEPLOYMENT_KEYS.get(field, field)}"


def load_disaggregated(path: str | Path) -> tuple[SimulationConfig, DisaggConfig]:
    """A TOML file with the usual sections plus [disaggregation]."""
    data = read_toml(path)
    disagg = DisaggConfig.from_dict(data.pop("disaggregation", {}))
    return SimulationConfig.from_dict(data), disagg
