"""The host's GPU link as a deployment setting: collectives priced from measured figures of that link."""
import pytest

from kernels_cost_model import make_cost_model
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.derived_defaults import shipped_defaults
from kernels_cost_model.errors import ConfigError
from kernels_cost_model.hardware import get_gpu
from kernels_cost_model.interconnect import host_gpu, native

BATCH = BatchShape([1] * 64, [1000] * 64, 64)


def test_auto_and_the_catalogs_own_link_change_nothing():
    for gpu, own in (("h100", "nvlink"), ("rtx-pro-6000", "pcie")):
        assert native(get_gpu(gpu)) == own and host_gpu(get_gpu(gpu), own) is get_gpu(gpu)
        base = make_cost_model("qwen3-32b", gpu, 2)
        for setting in ("auto", own):
            assert make_cost_model("qwen3-32b", gpu, 2, interconnect=setting).step_time(BATCH) == base.step_time(BATCH)


def test_an_nvlink_gpu_on_a_pcie_host_prices_all_reduce_at_the_pcie_gpus_efficiency_and_pcie5_rate():
    nv = make_cost_model("llama-3.1-70b", "h100", 4)
    pc = make_cost_model("llama-3.1-70b", "h100", 4, interconnect="pcie")
    eff = shipped_defaults()["groups"]["pcie"]["all_reduce"]
    assert pc.all_reduce.s_per_byte == pytest.approx(1.0 / (eff["memory"] * 64e9))     # PCIe 5.0 x16, one way
    assert pc.all_reduce_curve is None and nv.all_reduce_curve is not None
    assert pc.breakdown(BATCH)["all_reduce"] > 2 * nv.breakdown(BATCH)["all_reduce"]
    for key in ("qkv_proj", "mlp", "decode_attention"):
        assert pc.breakdown(BATCH)[key] == nv.breakdown(BATCH)[key]


def test_pcie_cards_with_a_catalogued_bridge_may_use_nvlink_and_others_may_not():
    bridged = make_cost_model("llama-3.1-70b", "a100-pcie-80gb", 4, interconnect="nvlink", calibration=None)
    plain = make_cost_model("llama-3.1-70b", "a100-pcie-80gb", 4, calibration=None)
    assert bridged.gpu.interconnect_bytes_per_s == 600e9 and bridged.gpu.has_nvlink
    assert bridged.breakdown(BATCH)["all_reduce"] < plain.breakdown(BATCH)["all_reduce"]
    with pytest.raises(ConfigError, match="interconnect='nvlink': rtx-pro-6000 has no NVLink"):
        make_cost_model("llama-3.1-8b", "rtx-pro-6000", 2, interconnect="nvlink")
    with pytest.raises(ConfigError, match="interconnect='infiniband'"):
        make_cost_model("llama-3.1-8b", "h100", 2, interconnect="infiniband")


def test_deployment_setting_reaches_the_cost_model_and_bad_values_name_the_field():
    from sim.api.cost_setup import build_cost_model
    from sim.api.sections import DeploymentConfig
    d = DeploymentConfig(model="llama-3.1-70b", gpu="h100", tensor_parallel_size=4, interconnect="pcie")
    assert not build_cost_model(d).gpu.has_nvlink
    with pytest.raises(ConfigError, match="deployment.interconnect"):
        DeploymentConfig(interconnect="ethernet")
