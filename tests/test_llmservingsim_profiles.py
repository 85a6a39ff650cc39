"""LLMServingSim's vLLM 0.19 kernel profiles, read in place: rows, shapes, and the shipped fit from them."""
from pathlib import Path

import pytest

from kernels_cost_model.calibration import predict, shipped_calibration
from kernels_cost_model.llmservingsim_profiles import read_shared_profiles

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "kernel_profiles"
pytestmark = pytest.mark.skipif(not (PROFILES / "llmservingsim").is_dir(), reason="shared kernel profiles absent")


@pytest.fixture(scope="module")
def rows():
    return read_shared_profiles(PROFILES, "RTXPRO6000")


def test_every_profile_reads_into_valid_rows(rows):
    ops = {r["operator"] for r in rows}
    assert ops >= {"qkv_proj", "o_proj", "mlp_up", "mlp_down", "rms_norm", "decode_attention", "prefill_attention"}
    assert all(r["device"] == "rtx-pro-6000" and "LLMServingSim@" in r["source"] for r in rows)
    assert {r["device"] for r in read_shared_profiles(PROFILES, "RTX4090")} == {"rtx-4090"}


def test_shapes_follow_the_model_on_one_gpu(rows):
    qkv = {(r["tp"], r["n"], r["k"]) for r in rows if r["operator"] == "qkv_proj"}
    assert (1.0, 6144.0, 4096.0) in qkv      # Llama-3.1-8B: (32 + 2 x 8) heads x 128
    assert (2.0, 5120.0, 5120.0) in qkv      # Qwen3-32B TP2: (32 + 2 x 4) heads x 128 per GPU
    dec = [r for r in rows if r["operator"] == "decode_attention" and r["tp"] == 2.0]
    assert {r["num_kv_heads"] for r in dec} >= {4.0}


def test_shipped_rtx_pro_6000_fit_reproduces_the_measured_decode_kernels(rows):
    cal = shipped_calibration("rtx-pro-6000")
    assert cal is not None and cal.provenance["holdout_samples"] > 0
    sel = [r for r in rows if r["operator"] in ("mlp_up", "decode_attention") and r["tp"] == 1.0
           and "Llama" in r["source"] and (r["m"] == 128 or r["batch"] == 128)]
    errors = sorted(abs(p / r["measured_s"] - 1) for p, r in zip(predict(sel, cal), sel))
    assert errors and errors[len(errors) // 2] < 0.10
