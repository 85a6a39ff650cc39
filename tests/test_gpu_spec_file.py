"""A GPU the catalog lacks, given as a JSON file of its datasheet figures."""
import json

import pytest

from kernels_cost_model import make_cost_model
from kernels_cost_model.errors import ConfigError
from kernels_cost_model.hardware import get_gpu
from sim.api.sections import DeploymentConfig, WorkloadConfig
from sim.api.simulator import EngineConfig, SimulationConfig, simulate

SPEC = {"name": "test-gddr7-card", "bf16_flops_per_s": 209.5e12, "fp8_flops_per_s": 419e12,
        "hbm_bytes_per_s": 1792e9, "memory_bytes": 32 * 2**30, "interconnect_bytes_per_s": 128e9,
        "interconnect": "PCIe Gen5 x16 (no NVLink)", "architecture": "blackwell", "compute_capability": "12.0",
        "memory_type": "GDDR7", "source": "figures of a test card"}


def write(tmp_path, spec: dict, name: str = "gpu.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(spec))
    return str(path)


def test_a_gpu_from_a_file_runs_priced_from_derived_defaults(tmp_path):
    path = write(tmp_path, SPEC)
    gpu = get_gpu(path)
    assert (gpu.name, gpu.memory_family, gpu.has_nvlink) == ("test-gddr7-card", "gddr", False)
    assert get_gpu("test-gddr7-card") is gpu  # code that carries the GPU by name finds it again
    with pytest.warns(UserWarning, match=r"no calibration shipped for GPU 'test-gddr7-card'.*blackwell GPUs"):
        cost = make_cost_model("llama-3.1-8b", path)
    efficiencies = cost.calibration.provenance["efficiencies"]
    assert efficiencies["elementwise"].startswith("derived default (gddr GPUs: ")
    config = SimulationConfig(deployment=DeploymentConfig(gpu=path), engine=EngineConfig(max_model_len=4096),
                              workload=WorkloadConfig(num_requests=20, rate=4.0))
    with pytest.warns(UserWarning):
        first, again = simulate(config), simulate(config)
    assert len(first.requests) == 20 and first.requests.equals(again.requests)


def test_faster_datasheet_figures_give_faster_steps(tmp_path):
    slow = write(tmp_path, dict(SPEC, name="test-slow-card"), "slow.json")
    fast = write(tmp_path, dict(SPEC, name="test-fast-card", bf16_flops_per_s=2 * SPEC["bf16_flops_per_s"],
                                hbm_bytes_per_s=2 * SPEC["hbm_bytes_per_s"]), "fast.json")
    from kernels_cost_model.batch import BatchShape
    with pytest.warns(UserWarning):
        times = [make_cost_model("llama-3.1-8b", p).step_time(BatchShape([512, 1], [0, 900], 2)) for p in (slow, fast)]
    assert times[1] < 0.75 * times[0]


@pytest.mark.parametrize("change, field, reason", [
    ({"bf16_flops_per_s": None}, "gpu", "missing field"),
    ({"tflops": 3}, "gpu", "unknown field"),
    ({"hbm_bytes_per_s": -1.0}, "hbm_bytes_per_s", "must be a number > 0"),
    ({"memory_bytes": "80GB"}, "memory_bytes", "must be a number > 0"),
    ({"name": "H100"}, "name", "names the catalog's 'h100-sxm'"),
    ({"name": ""}, "name", "non-empty"),
])
def test_a_malformed_gpu_file_is_a_named_error(tmp_path, change, field, reason):
    spec = {k: v for k, v in {**SPEC, "name": f"test-bad-{len(str(change))}", **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=reason) as err:
        get_gpu(write(tmp_path, spec))
    assert err.value.field.endswith(field)


def test_unreadable_files_and_a_name_given_two_sets_of_figures_are_named_errors(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read the GPU spec file"):
        get_gpu(str(bad))
    with pytest.raises(ConfigError, match="one JSON object"):
        get_gpu(write(tmp_path, [SPEC], "list.json"))
    get_gpu(write(tmp_path, dict(SPEC, name="test-twice"), "one.json"))
    with pytest.raises(ConfigError, match="other figures"):
        get_gpu(write(tmp_path, dict(SPEC, name="test-twice", memory_bytes=16 * 2**30), "two.json"))
