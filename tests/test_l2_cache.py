"""Elementwise launches priced per L2 tier and per wave of token rows (kernels_cost_model/l2_cache.py)."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

from kernels_cost_model.calibration import holdout_split, predict, shipped_calibration
from kernels_cost_model.l2_cache import (L2_RESIDENT_FRACTION, ElementwiseOp, elementwise_op, elementwise_tier,
                                         l2_bytes, rows_per_sm, wave_bytes)
from kernels_cost_model.roofline import Coeffs, elementwise
from kernels_cost_model.shape_keys import kernel_cost

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "kernel_profiles"
needs_data = pytest.mark.skipif(not (PROFILES / "llmservingsim").is_dir(), reason="shared kernel profiles absent")


def test_the_tier_follows_the_documented_l2_size():
    limit = L2_RESIDENT_FRACTION * 128 * 2**20          # RTX PRO 6000: 128 MiB of L2
    assert l2_bytes("rtx-pro-6000") == l2_bytes("rtx-pro-6000@vllm-0.19") == 128 * 2**20
    assert elementwise_tier("rtx-pro-6000", limit) == "l2"
    assert elementwise_tier("rtx-pro-6000", limit + 1) == "dram"
    assert elementwise_tier("l4", 1.0) is None           # no documented L2 size: one tier


def test_waves_count_token_rows_over_the_sms():
    assert wave_bytes("rtx-pro-6000", 188, 1000.0) == 1000.0      # 188 SMs: one wave
    assert wave_bytes("rtx-pro-6000", 189, 1000.0) == 2000.0
    assert wave_bytes("h100-sxm", 1000, 1000.0) == 0.0             # Inductor's kernels: no wave side


def test_rmsnorm_blocks_shrink_from_256_tokens_so_six_rows_share_an_sm():
    row = 4096 * 2.0                                                # Llama-3.1-8B hidden, bf16
    assert rows_per_sm("rms_norm", 255, 4096) == 3                  # 512-thread blocks: 3 per 1536 threads
    assert rows_per_sm("add_rms_norm", 255, 4096) == 1              # fused add: min(hidden, 1024) threads
    assert rows_per_sm("add_rms_norm", 256, 4096) == 6              # 256-thread blocks from 256 tokens
    assert rows_per_sm("silu_mul", 4096, 14336) == 1
    assert wave_bytes("rtx-pro-6000", 6 * 188, row, "rms_norm") == row          # 1128 rows: one wave
    assert wave_bytes("rtx-pro-6000", 6 * 188 + 1, row, "rms_norm") == 2 * row
    assert wave_bytes("rtx-pro-6000", 6 * 188, row, "silu_mul") == 6 * row


def test_a_dram_tier_row_is_priced_on_its_bytes_past_the_limit():
    row = {"operator": "silu_mul", "family": "elementwise", "m": 2048.0, "n": 14336.0, "dtype_bytes": 2,
           "device": "rtx-pro-6000"}
    _, nbytes = elementwise("silu_mul", 2048.0, 14336.0, 2)
    flops, priced = kernel_cost(row)
    assert priced == pytest.approx(nbytes - L2_RESIDENT_FRACTION * 128 * 2**20)
    assert flops == np.ceil(2048 / 188) * 14336 * 2


@given(st.floats(1e3, 1e9), st.floats(1e3, 1e9), st.integers(1, 4096), st.integers(0, 4096))
def test_more_bytes_or_rows_never_cost_less(b1, b2, r1, extra):
    op = ElementwiseOp(Coeffs(0.0, 5e-13, 2e-6), l2=Coeffs(1e-10, 2e-13, 2e-6, 0.0, 1e-9),
                       dram=Coeffs(0.0, 6e-13, 0.0), l2_limit=8e7, sms=188.0)
    lo, hi = sorted((b1, b2))
    assert op.cost(lo, r1, 2e4) <= op.cost(hi, r1 + extra, 2e4)


@given(st.floats(1e3, 1e9), st.floats(1e3, 1e9), st.integers(1, 4096))
def test_an_operator_measured_only_in_l2_keeps_that_tier_and_stays_monotone(b1, b2, rows):
    base, l2 = Coeffs(0.0, 5e-13, 2e-6), Coeffs(1e-10, 2e-13, 1e-6, 0.0, 1e-9)
    op = ElementwiseOp(base, l2=l2, l2_limit=8e7, sms=188.0, op="rms_norm")
    lo, hi = sorted((b1, b2))
    assert op.cost(lo, rows, 2e4) <= op.cost(hi, rows, 2e4)
    assert op.cost(1e6, 1, 8192.0) == pytest.approx(max(1e6 * 2e-13, 8192 * 1e-10) + 1e-6 + 1e-9)


def test_the_cost_model_takes_the_tiers_of_a_calibration_that_has_them():
    cal = shipped_calibration("rtx-pro-6000")
    op = elementwise_op(cal.coeffs, "rtx-pro-6000", "silu_mul")
    assert op.l2 is cal.coeffs["elementwise.silu_mul@l2"] and op.dram is cal.coeffs["elementwise.silu_mul@dram"]
    assert elementwise_op(cal.coeffs, "l4", "silu_mul").l2 is None
    norm = elementwise_op(cal.coeffs, "rtx-pro-6000", "rms_norm")  # measured within L2 only
    assert norm.l2 is cal.coeffs["elementwise.rms_norm@l2"] and norm.dram is None


@needs_data
def test_the_silu_cliff_is_priced_on_both_sides():
    """LLMServingSim's act_fn of Llama-3.1-8B on the RTX PRO 6000 at TP1, below (400 tokens) and past the
    L2 limit (1024-2032 tokens): the operator's one byte rate misses the rows past it by over 40 %, the
    two tiers price every one of them within 10 %."""
    from kernels_cost_model.llmservingsim_profiles import read_shared_profiles
    rows = [r for r in read_shared_profiles(PROFILES, "RTXPRO6000")
            if r["operator"] == "silu_mul" and r["n"] == 14336 and r["m"] in (400.0, 1024.0, 1600.0, 2032.0)]
    assert len(rows) == 4
    measured = np.array([r["measured_s"] for r in rows])
    cal = shipped_calibration("rtx-pro-6000")
    assert np.abs(predict(rows, cal) / measured - 1).max() < 0.10
    one_rate = cal.coeffs["elementwise.silu_mul"]
    err = np.array([one_rate.time(*elementwise("silu_mul", r["m"], r["n"], 2)) for r in rows]) / measured - 1
    assert (err[1:] < -0.40).all()


@needs_data
@pytest.mark.parametrize("name", ["rtx-pro-6000", "rtx-4090"])  # (the GPUs measured under vLLM)
def test_elementwise_held_out_error_is_within_the_goal(name):
    from kernels_cost_model.calibration import relative_errors
    from kernels_cost_model.gpu_calibration import device_rows
    _, held = holdout_split([r for r in device_rows(PROFILES, name) if r["family"] == "elementwise"])
    got = relative_errors(held, shipped_calibration(name))["elementwise"]["median_rel_err"]
    recorded = shipped_calibration(name).provenance["holdout_error"]["elementwise"]["median_rel_err"]
    assert got == pytest.approx(recorded) and got < 0.06


@pytest.mark.parametrize("name", ["a100-sxm-80gb", "b200"])
def test_a_derived_elementwise_default_streams_no_faster_than_the_hbm_beyond_the_l2(name):
    from kernels_cost_model.hardware import get_gpu
    from kernels_cost_model.l2_cache import L2_RESIDENT_FRACTION, elementwise_op, l2_bytes
    cal = shipped_calibration(name)
    assert cal.provenance["unfitted_families"]["elementwise"].startswith("derived default")
    op = elementwise_op(cal.coeffs, name, "rms_norm")
    hbm = get_gpu(name).hbm_bytes_per_s
    big = 4 * l2_bytes(name)                      # far past the L2: streamed at most at the HBM's rate
    assert op.cost(big, 1.0, 1.0) >= big / hbm
    small = 0.1 * L2_RESIDENT_FRACTION * l2_bytes(name)  # within it: the family's faster rate
    assert op.l2 is not None and op.cost(small, 1.0, 1.0) < op.base.time(0.0, small)



@pytest.mark.parametrize("name", ["h100-sxm", "h200", "b200"])
def test_launches_outside_a_layer_stream_at_the_dram_tier_past_the_l2(name):
    """The sampler's and the MoE permutes' launches: within the L2 at its tier (the operator's fit over
    every size reads faster than the HBM there: mostly L2-resident launches), past it never faster than
    the HBM streams; with no bytes, the launch overheads alone."""
    from kernels_cost_model.hardware import get_gpu
    from kernels_cost_model.l2_cache import elementwise_op, l2_bytes
    op = elementwise_op(shipped_calibration(name).coeffs, name, "add")
    big = 8 * l2_bytes(name)
    assert op.launches(4, big) >= big / get_gpu(name).hbm_bytes_per_s
    assert op.launches(4, big) > big * op.base.s_per_byte           # the all-sizes fit would price it faster
    small = 0.01 * l2_bytes(name)
    assert op.launches(2, small) == pytest.approx(2 * op.cost(small / 2, 0.0, 0.0))
    assert op.launches(3, 0.0) == pytest.approx(3 * op.l2.overhead_s) and op.launches(0, big) == 0.0
