"""Public API: configs, `simulate`, results, metrics and the summary text."""
from sim.api.results import Results
from sim.api.cost_setup import build_cost_model
from sim.api.sections import DeploymentConfig, WorkloadConfig, read_toml
from sim.api.simulator import SimulationConfig, SLOConfig, resolve_num_gpu_blocks, simulate

__all__ = ["DeploymentConfig", "Results", "SLOConfig", "SimulationConfig", "WorkloadConfig", "build_cost_model",
           "read_toml", "resolve_num_gpu_blocks", "simulate"]
