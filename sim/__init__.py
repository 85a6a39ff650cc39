"""servesim: a deterministic discrete-event simulator of a vLLM-style LLM serving engine."""
from kernels_cost_model.errors import ConfigError
from sim.core.replay import StopResult, run_until_stop
from sim.core.request import Request, RequestStatus, finish_reason, is_finished
from sim.core.sampling_params import SamplingParams
from sim.core.stop_rules import PROFILES, StopProfile, get_profile

__all__ = [
    "ConfigError", "PROFILES", "Request", "RequestStatus", "SamplingParams", "StopProfile",
    "StopResult", "finish_reason", "get_profile", "is_finished", "run_until_stop",
]

from sim.api.simulator import DeploymentConfig, SimulationConfig, SLOConfig, WorkloadConfig, simulate  # noqa: E402
from sim.core.config import EngineConfig  # noqa: E402
from sim.core.speculative import SpeculativeConfig  # noqa: E402
from sim.api.results import Results  # noqa: E402

__all__ += ["DeploymentConfig", "EngineConfig", "Results", "SLOConfig", "SimulationConfig",
            "SpeculativeConfig", "WorkloadConfig", "simulate"]
