"""The Intel Arc Pro B60: an XPU served eagerly before vLLM 0.33, its collectives through oneCCL,
calibrated from AIConfigurator's b60 tables like the NVIDIA GPUs."""
import pytest

from kernels_cost_model.aiconfigurator_tables import read_table
from kernels_cost_model.builder import make_cost_model
from kernels_cost_model.derived_defaults import group_of
from kernels_cost_model.hardware import get_gpu
from kernels_cost_model.l2_cache import l2_bytes
from kernels_cost_model.mxfp4_layout import backend_for

ALL_REDUCE = {"version": ["0.20.0"] * 2, "num_gpus": [2, 2], "message_size": [4096, 4096],
              "kernel_source": ["vLLM_custom_graph", "vLLM_custom_eager"], "latency": [0.01, 0.03]}


def _write_all_reduce(root, system):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    path = root / "aiconfigurator" / system / "comm" / "vllm" / "0.20.0" / "custom_allreduce_perf.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(ALL_REDUCE), path)


def test_reader_keeps_the_all_reduce_rows_of_the_path_vllm_serves(tmp_path):
    for system in ("b60", "l40s"):
        _write_all_reduce(tmp_path, system)
    (xpu,) = read_table(tmp_path, "b60", "all_reduce")
    (cuda,) = read_table(tmp_path, "l40s", "all_reduce")
    assert xpu["measured_s"] == pytest.approx(30e-6) and xpu["device"] == "arc-pro-b60"  # eager on the XPU
    assert cuda["measured_s"] == pytest.approx(10e-6)                                     # graphs elsewhere


def test_catalog_row_and_l2():
    gpu = get_gpu("b60")
    assert gpu.name == "arc-pro-b60" and gpu.architecture == "xe2" and not gpu.has_nvlink
    assert gpu.fp8_flops_per_s is None  # no FP8 matrix engine
    assert l2_bytes("arc-pro-b60") == 18 * 2**20


def test_served_eagerly_up_to_0_19_and_with_graphs_from_0_33():
    """vLLM 0.19's XPU platform turns graphs off unless VLLM_XPU_ENABLE_XPU_GRAPH=1; 0.33's captures them
    wherever its torch supports XPU graphs (the variable and the single-GPU rule are gone)."""
    b60_019 = make_cost_model("llama-3.1-8b", "arc-pro-b60", vllm_release="0.19")
    b60_033 = make_cost_model("llama-3.1-8b", "arc-pro-b60", vllm_release="0.33")
    h100 = make_cost_model("llama-3.1-8b", "h100-sxm", vllm_release="0.19")
    assert b60_019.cuda_graph_sizes == () and h100.cuda_graph_sizes
    assert b60_033.cuda_graph_sizes == make_cost_model("llama-3.1-8b", "h100-sxm").cuda_graph_sizes
    assert make_cost_model("llama-3.1-8b", "arc-pro-b60", enforce_eager=True).cuda_graph_sizes == ()
    assert make_cost_model("llama-3.1-8b", "h100-sxm", enforce_eager=True).cuda_graph_sizes == ()


def test_groups_collectives_apart_and_lays_mxfp4_out_as_the_checkpoint():
    b60, l40s = get_gpu("arc-pro-b60"), get_gpu("l40s")
    assert group_of(b60, "all_reduce") == "oneccl" and group_of(l40s, "all_reduce") == "pcie"
    assert group_of(b60, "decode_attention") == "xe2" and group_of(b60, "matmul") == "xe2"
    assert backend_for(b60).name == "checkpoint"


def test_shipped_calibration_prices_from_its_own_fits():
    model = make_cost_model("llama-3.1-8b", "arc-pro-b60")
    prov = model.calibration.provenance
    assert {"matmul", "prefill_attention", "decode_attention", "all_reduce"} <= set(prov["fitted_families"])
    assert "b60" in " ".join(prov["sources"])
    assert any(key.startswith("all_reduce@") for key in model.calibration.curves)


def test_its_shape_keys_stay_out_of_the_all_gpu_defaults():
    from kernels_cost_model.derived_defaults import shipped_defaults
    defaults = shipped_defaults()
    assert "arc-pro-b60" in defaults["all"]["matmul"]["from"]        # its family figures vote
    own = set(defaults["groups"]["xe2"])
    only_b60 = {k for k in own if "32768" in k}                      # a grid the NVIDIA tables lack
    assert only_b60 and not only_b60 & set(defaults["all"])
    assert defaults["groups"]["oneccl"]["all_reduce"]["from"] == ["arc-pro-b60"]
    assert "arc-pro-b60" not in defaults["groups"]["pcie"]["all_reduce"]["from"]
