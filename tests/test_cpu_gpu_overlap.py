"""deployment.cpu_gpu_overlap: the step-time overlap of CPU and GPU work, which follows the engine's
async scheduling unless set (issue 20: one async switch for the schedule, one for the cost)."""
from __future__ import annotations

import pytest

from kernels_cost_model.errors import ConfigError
from sim.api.cost_setup import build_cost_model, cpu_gpu_overlap
from sim.api.sections import DeploymentConfig
from sim.api.simulator import SimulationConfig
from sim.core.config import EngineConfig
from tests.test_cli_vllm_names import config_of


def test_unset_follows_the_engines_async_scheduling():
    d = DeploymentConfig()
    assert cpu_gpu_overlap(d, EngineConfig()) is True   # vLLM's default: async scheduling on
    assert cpu_gpu_overlap(d, EngineConfig(async_scheduling=False)) is False
    assert cpu_gpu_overlap(DeploymentConfig(cpu_gpu_overlap=False), EngineConfig()) is False
    assert cpu_gpu_overlap(DeploymentConfig(cpu_gpu_overlap=True), EngineConfig(async_scheduling=False))
    assert build_cost_model(d, EngineConfig()).async_scheduling
    assert not build_cost_model(d, EngineConfig(async_scheduling=False)).async_scheduling


def test_the_old_name_is_an_error_naming_the_new_one():
    with pytest.raises(ConfigError, match="deployment.async_scheduling.*cpu_gpu_overlap"):
        SimulationConfig.from_dict({"deployment": {"async_scheduling": True}})
    with pytest.raises(ConfigError, match="deployment.cpu_gpu_overlap"):
        DeploymentConfig(cpu_gpu_overlap="yes")


def test_cli_flag():
    assert config_of("--no-cpu-gpu-overlap").deployment.cpu_gpu_overlap is False
    assert config_of().deployment.cpu_gpu_overlap is None
