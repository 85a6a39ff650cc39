"""servesim: a deterministic discrete-event simulator of a vLLM-style LLM serving engine.

The facade: the public names of every layer. The engine core's names load at once; the API's
(`SimulationConfig`, `simulate`, `Results`, ...) load on first use, so importing a lower layer
(`sim.core`, `policies`, `workloads`) never pulls the layers above it in.
"""
from importlib import import_module

from kernels_cost_model.errors import ConfigError
from sim.core.config import EngineConfig
from sim.core.replay import StopResult, run_until_stop
from sim.core.request import Request, RequestStatus, finish_reason, is_finished
from sim.core.sampling_params import SamplingParams
from sim.core.stop_rules import PROFILES, StopProfile, get_profile

_LAZY = {name: "sim.api.simulator" for name in
         ("DeploymentConfig", "SimulationConfig", "SLOConfig", "WorkloadConfig", "simulate")}
_LAZY["Results"] = "sim.api.results"
_LAZY["SpeculativeConfig"] = "sim.core.speculative"
_LAZY["__version__"] = "sim.api.version"

__all__ = [
    "ConfigError", "EngineConfig", "PROFILES", "Request", "RequestStatus", "SamplingParams", "StopProfile",
    "StopResult", "finish_reason", "get_profile", "is_finished", "run_until_stop", *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
