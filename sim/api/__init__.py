"""Public API: configs, `simulate`, results, metrics and the summary text."""
from sim.api.results import Results
from sim.api.simulator import (DeploymentConfig, SimulationConfig, SLOConfig, WorkloadConfig, build_cost_model,
                              read_toml, resolve_num_gpu_blocks, simulate)

__all__ = ["DeploymentConfig", "Results", "SLOConfig", "SimulationConfig", "WorkloadConfig", "build_cost_model",
           "read_toml", "resolve_num_gpu_blocks", "simulate"]
