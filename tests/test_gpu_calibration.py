"""Calibrations of every GPU with measured kernels: table readers, shape lookups, the shipped files."""
import os
from pathlib import Path

import numpy as np
import pytest

from kernels_cost_model.aiconfigurator_tables import MalformedTableError, read_table
from kernels_cost_model.calibration import Calibration, relative_errors, shipped_calibration
from kernels_cost_model.gpu_calibration import SOURCES, device_of, device_rows
from kernels_cost_model.roofline import FAMILIES, Coeffs
from kernels_cost_model.shape_keys import attention_coeffs, matmul_coeffs

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "kernel_profiles"
needs_data = pytest.mark.skipif(not PROFILES.is_dir(), reason="shared kernel profiles absent")


def _write(root: Path, system: str, sub: str, name: str, columns: dict) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    path = root / "aiconfigurator" / system / sub / "vllm" / "0.24.0" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


GEN = {"version": ["0.24.0"] * 3, "batch_size": [8, 8, 8], "step": [127, 127, 127], "num_heads": [32, 32, 32],
       "num_key_value_heads": [0, 8, 8], "head_dim": [128, 128, 128],
       "kv_cache_dtype": ["bfloat16", "bfloat16", "bfloat16"], "window_size": [0, 0, 128],
       "latency": [0.02, 0.015, 0.01]}


def test_reader_maps_generation_attention_rows(tmp_path):
    _write(tmp_path, "h100_sxm", "attention", "generation_attention_perf.parquet", GEN)
    rows = list(read_table(tmp_path, "h100_sxm", "generation_attention"))
    assert len(rows) == 2                                   # the sliding-window row is not full attention
    assert rows[0]["num_kv_heads"] == 32                    # 0 KV heads is the loader's MHA convention
    assert rows[1]["context"] == 127 and rows[1]["measured_s"] == pytest.approx(15e-6)
    assert all(r["device"] == "h100-sxm" and "aiconfigurator@095f58a5" in r["source"] for r in rows)


def test_reader_keeps_graph_all_reduce_and_counts_bytes(tmp_path):
    _write(tmp_path, "l40s", "comm", "custom_allreduce_perf.parquet",
           {"version": ["0.24.0"] * 2, "num_gpus": [2, 2], "message_size": [4096, 4096],
            "kernel_source": ["vLLM_custom_graph", "vLLM_custom_eager"], "latency": [0.01, 0.03]})
    (row,) = read_table(tmp_path, "l40s", "all_reduce")
    assert row["size_bytes"] == 8192 and row["tp"] == 2     # bf16 elements -> bytes


@pytest.mark.parametrize("change,field", [
    ({"latency": [0.02, -1.0, 0.01]}, "latency"),
    ({"latency": [0.02, 9e9, 0.01]}, "latency"),
    ({"batch_size": [8, 0, 8]}, "batch_size"),
    ({"num_heads": [32, 0, 32]}, "num_heads"),
])
def test_reader_rejects_bad_values_naming_the_column(tmp_path, change, field):
    _write(tmp_path, "h100_sxm", "attention", "generation_attention_perf.parquet", {**GEN, **change})
    with pytest.raises(MalformedTableError) as err:
        list(read_table(tmp_path, "h100_sxm", "generation_attention"))
    assert field in err.value.field


def test_reader_rejects_missing_columns_and_non_parquet(tmp_path):
    cols = {k: v for k, v in GEN.items() if k != "step"}
    _write(tmp_path, "h100_sxm", "attention", "generation_attention_perf.parquet", cols)
    with pytest.raises(MalformedTableError, match="step"):
        list(read_table(tmp_path, "h100_sxm", "generation_attention"))
    bad = tmp_path / "aiconfigurator" / "h200_sxm" / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_text("version https://git-lfs.github.com/spec/v1\n")  # a Git LFS pointer, not the table
    with pytest.raises(MalformedTableError, match="Parquet"):
        list(read_table(tmp_path, "h200_sxm", "gemm"))


def test_matmul_lookup_exact_then_interpolated_in_log_space():
    lo, hi = Coeffs(1e-15, 4e-13, 4e-6), Coeffs(2e-15, 8e-13, 8e-6)
    coeffs = {"matmul": Coeffs(9e-15, 9e-13, 9e-6), "matmul@1024x1024": lo, "matmul@4096x1024": hi,
              "matmul@1024x4096": lo, "matmul@4096x4096": hi}
    assert matmul_coeffs(coeffs, 1024, 4096) is lo
    mid = matmul_coeffs(coeffs, 2048, 2048)                 # halfway in log n: the mean of the corners
    assert mid.s_per_flop == pytest.approx(1.5e-15) and mid.overhead_s == pytest.approx(6e-6)
    assert matmul_coeffs(coeffs, 8192, 2048).s_per_flop == pytest.approx(2e-15)  # clamped at the grid edge
    assert matmul_coeffs({"matmul": lo}, 100, 100) is None


def test_a_model_layer_shape_is_priced_exactly_and_never_breaks_the_grid():
    lo, hi, own = Coeffs(1e-15, 4e-13, 4e-6), Coeffs(2e-15, 8e-13, 8e-6), Coeffs(7e-15, 7e-13, 7e-6)
    grid = {"matmul": Coeffs(9e-15, 9e-13, 9e-6), "matmul@1024x1024": lo, "matmul@4096x1024": hi,
            "matmul@1024x4096": lo, "matmul@4096x4096": hi}
    coeffs = {**grid, "matmul@3000x1024": own}              # a per-layer profile's own shape, off the grid
    assert matmul_coeffs(coeffs, 3000, 1024) is own
    assert matmul_coeffs(coeffs, 2048, 2048) == matmul_coeffs(grid, 2048, 2048)
    lone = {"matmul": lo, "matmul@3000x1024": own, "matmul@1024x4096": hi}  # no grid: exact shapes only
    assert matmul_coeffs(lone, 2048, 2048) is None and matmul_coeffs(lone, 1024, 4096) is hi
    one_model = {"matmul": lo, "matmul@6144x4096": own, "matmul@4096x4096": hi, "matmul@4096x14336": own}
    assert matmul_coeffs(one_model, 128256, 4096) is None    # one model's layers are no grid to clamp to


def test_attention_lookup_prefers_the_same_query_group_and_head_size():
    gqa4, mha, d64 = Coeffs(0, 3e-13, 1e-5), Coeffs(0, 4e-13, 1e-5), Coeffs(0, 5e-13, 1e-5)
    coeffs = {"decode_attention@32/8/128": gqa4, "decode_attention@32/32/128": mha,
              "decode_attention@16/4/64": d64}
    assert attention_coeffs(coeffs, "decode_attention", 64, 16, 128) is gqa4   # 4 query heads per KV head
    assert attention_coeffs(coeffs, "decode_attention", 40, 40, 128) is mha
    assert attention_coeffs(coeffs, "decode_attention", 32, 8, 256) is None


@pytest.mark.parametrize("device", sorted(SOURCES))
def test_every_gpu_with_measurements_ships_a_calibration_with_provenance(device):
    cal = shipped_calibration(device)
    assert isinstance(cal, Calibration) and cal.device == device_of(device)
    prov = cal.provenance
    assert prov["licence"] and prov["software"] and prov["holdout_samples"] > 0
    assert set(prov["fitted_families"]) | set(prov["unfitted_families"]) >= set(FAMILIES)
    for family in prov["fitted_families"]:
        assert prov["holdout_error"][family]["n"] > 0, family
    for family, why in prov["unfitted_families"].items():
        assert why.startswith("derived default"), (family, why)


#: Devices checked in CI (a few seconds each); HYPOTHESIS_PROFILE=thorough checks all of them.
CI_DEVICES = ("rtx-4090", "a100-sxm-80gb", "rtx-pro-6000@vllm-0.19")


@needs_data
@pytest.mark.parametrize("device", sorted(SOURCES))
def test_calibration_reproduces_its_recorded_held_out_error(device):
    if os.environ.get("CI") and device not in CI_DEVICES:
        pytest.skip("CI checks a subset; the thorough run checks every GPU")
    from kernels_cost_model.calibration import holdout_split
    cal = shipped_calibration(device)
    _fit, held = holdout_split(device_rows(PROFILES, device))
    assert len(held) == cal.provenance["holdout_samples"]
    got = relative_errors(held, cal)
    for family, recorded in cal.provenance["holdout_error"].items():
        assert got[family]["n"] == recorded["n"]
        assert got[family]["median_rel_err"] == pytest.approx(recorded["median_rel_err"], rel=1e-9, abs=1e-12)
    assert np.isfinite([e["max_rel_err"] for e in got.values()]).all()


def test_named_variant_is_vllm_019_only_and_picked_by_name_for_its_gpu_alone():
    from kernels_cost_model import make_cost_model
    from kernels_cost_model.builder import shipped_variants
    from kernels_cost_model.errors import ConfigError
    assert "rtx-pro-6000@vllm-0.19" in shipped_variants()
    cal = shipped_calibration("rtx-pro-6000@vllm-0.19")
    assert cal.provenance["software"] == ["vLLM 0.19.0"] and len(cal.provenance["licence"]) == 1
    assert cal.provenance["holdout_error"]["decode_attention"]["median_rel_err"] <= 0.05
    picked = make_cost_model("llama-3.1-8b", "rtx-pro-6000", calibration="rtx-pro-6000@vllm-0.19")
    assert picked.calibration is cal
    assert make_cost_model("llama-3.1-8b", "rtx-pro-6000").calibration is not cal
    with pytest.raises(ConfigError, match="not of h100"):
        make_cost_model("llama-3.1-8b", "h100", calibration="rtx-pro-6000@vllm-0.19")
    with pytest.raises(ConfigError, match="shipped variants"):
        make_cost_model("llama-3.1-8b", "rtx-pro-6000", calibration="rtx-pro-6000@vllm-9.9")


def test_variants_do_not_feed_the_derived_defaults():
    import json
    from importlib import resources
    text = resources.files("kernels_cost_model").joinpath("data", "derived_defaults.json").read_text()
    assert "@vllm" not in text and "rtx-pro-6000@" not in json.dumps(json.loads(text)["all"]["matmul"]["from"])
