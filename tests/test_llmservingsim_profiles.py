"""The transcribed RTX PRO 6000 kernel profiles: read into profile rows, and the shipped fit from them."""
import pytest

from kernels_cost_model.calibration import predict, shipped_calibration
from kernels_cost_model.llmservingsim_profiles import profile_files, read_profiles


def test_every_transcribed_file_reads_into_valid_rows():
    files = profile_files()
    assert {f.name for f in files} >= {"rtx-pro-6000_Llama-3.1-8B_tp1.csv", "rtx-pro-6000_Qwen3-32B_tp2.csv"}
    rows = read_profiles()
    ops = {r["operator"] for r in rows}
    assert ops >= {"qkv_proj", "o_proj", "mlp_up", "mlp_down", "rms_norm", "decode_attention", "prefill_attention"}
    assert all(r["device"] == "rtx-pro-6000" and "LLMServingSim@" in r["source"] for r in rows)


def test_shapes_follow_the_model_on_one_gpu():
    rows = read_profiles()
    qkv = {(r["tp"], r["n"], r["k"]) for r in rows if r["operator"] == "qkv_proj"}
    assert (1.0, 6144.0, 4096.0) in qkv      # Llama-3.1-8B: (32 + 2 x 8) heads x 128
    assert (2.0, 5120.0, 5120.0) in qkv      # Qwen3-32B TP2: (32 + 2 x 4) heads x 128 per GPU
    dec = [r for r in rows if r["operator"] == "decode_attention" and r["tp"] == 2.0]
    assert {r["num_kv_heads"] for r in dec} == {4.0} and min(r["context"] for r in dec) == 121.0


def test_shipped_rtx_pro_6000_fit_reproduces_the_measured_decode_kernels():
    cal = shipped_calibration("rtx-pro-6000")
    assert cal is not None and cal.provenance["holdout_samples"] > 0
    rows = [r for r in read_profiles() if r["operator"] in ("mlp_up", "decode_attention") and
            (r["m"] == 128 or r["batch"] == 128)]
    errors = [abs(p / r["measured_s"] - 1) for p, r in zip(predict(rows, cal), rows)]
    assert max(errors) < 0.2 and sorted(errors)[len(errors) // 2] < 0.08
