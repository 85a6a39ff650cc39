"""Prefill attention as FA2 schedules it (64-row units in waves over the SMs), the LLMServingSim attention
columns read as cached tokens, and prefill rows timed with Q/K/V/O in L2 kept apart from serving's."""
import csv
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model import make_cost_model
from kernels_cost_model.aiconfigurator_tables import L2_BYTES, prefill_bytes, read_table
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.calibration import predict, shipped_calibration
from kernels_cost_model.llmservingsim_profiles import read_shared_profiles
from kernels_cost_model.prefill_waves import (batch_path_keys, key_block, path_keys, row_path_keys,
                                              sequence_path, sequence_units)
from kernels_cost_model.shape_keys import coeffs_for_row
from tests.aic_tables import write_attention_table

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "kernel_profiles"
LSS_4090 = PROFILES / "llmservingsim" / "RTX4090" / "meta-llama" / "Llama-3.1-8B" / "bf16" / "tp1" / "attention.csv"


@given(st.integers(2, 5000), st.integers(0, 20000), st.sampled_from([64, 128, 256]))
def test_sequence_units_sum_each_tiles_keys_in_whole_blocks(chunk, context, block):
    tiles = math.ceil(chunk / 64)
    brute = sum(math.ceil((context + min(64 * (j + 1), chunk)) / block) * block for j in range(tiles))
    assert sequence_units(chunk, context, block) == (tiles, brute)


@given(st.lists(st.tuples(st.integers(2, 4000), st.integers(0, 20000)), min_size=1, max_size=6),
       st.tuples(st.integers(0, 4000), st.integers(0, 20000)), st.integers(0, 5), st.sampled_from([108, 128, 188]))
def test_path_never_falls_when_a_row_grows_or_is_added(rows, extra, which, sms):
    new, ctx = [c for c, _ in rows], [p for _, p in rows]
    base = batch_path_keys(new, ctx, 32, sms, 128)
    assert base >= max(c + p for c, p in rows)
    grown = list(new)
    grown[which % len(new)] += extra[0]
    assert batch_path_keys(grown, ctx, 32, sms, 128) >= base
    longer = list(ctx)
    longer[which % len(ctx)] += extra[1]
    assert batch_path_keys(new, longer, 32, sms, 128) >= base
    assert batch_path_keys(new + [extra[0]], ctx + [extra[1]], 32, sms, 128) >= base


def test_one_sequence_takes_its_waves():
    # 40 tiles x 32 heads = 1280 units of 1024 keys on 128 SMs: 10 waves of one unit each
    tiles, keys = 40, 40 * 1024.0
    assert sequence_path(tiles, keys, 1024, 32, 128) == 10 * 1024
    assert sequence_path(4, 4 * 1024.0, 1024, 32, 128) == 1024                   # one wave: the longest unit
    assert path_keys(10 * 1024, 2 * 1280 * 1024, 1024, 2, 128) == 20 * 1024 + 512  # two: spread + half a unit


def test_units_of_one_wave_take_the_longest_unit_and_more_take_waves():
    # RTX 4090, 32 query heads, 16384 cached keys: chunks of 16-256 tokens are at most 4 tiles x 32 heads =
    # 128 units on 128 SMs (one wave); 512 tokens are two waves
    one_wave = [row_path_keys("rtx-4090", c, 16384, 1, 32, 128) for c in (16, 64, 256)]
    assert one_wave == [16384 + 128] * 2 + [16384 + 256]
    assert 1.9 < row_path_keys("rtx-4090", 512, 16384, 1, 32, 128) / one_wave[-1] < 2.05
    assert row_path_keys("h100-sxm", 512, 16384, 1, 32, 128) == 16384 + 512   # not FA2: the longest row
    assert key_block(64) == 256 and key_block(128) == 128


def test_the_cost_model_folds_a_batch_as_the_profile_rows_do():
    sms, block = 128, 128
    assert batch_path_keys([512, 512, 1], [100, 100, 9000], 32, sms, block) == \
        row_path_keys("rtx-4090", 512, 100, 2, 32, 128)
    cm = make_cost_model("llama-3.1-8b", "rtx-4090", calibration="default")
    assert cm.prefill_waves == (128, 32.0, 128)
    attn = [cm.breakdown(BatchShape([c], [16384], 1))["prefill_attention"] for c in (256, 512)]
    assert 1.6 < attn[1] / attn[0] < 2.2   # the second wave (the longest row alone: ~1.0)


@pytest.mark.skipif(not LSS_4090.is_file(), reason="shared kernel profiles absent")
def test_llmservingsim_attention_columns_are_cached_tokens():
    rows = [r for r in read_shared_profiles(PROFILES, "RTX4090") if r["operator"] == "prefill_attention"]
    shapes = {(r["chunk"], r["context"]): r["measured_s"] for r in rows}
    with LSS_4090.open() as f:
        raw = [r for r in csv.DictReader(f) if r["n_decode"] == "0" and r["prefill_chunk"] != "0"]
    assert len(shapes) == len(raw)                         # none dropped
    assert shapes[(2048.0, 0.0)] < 0.5 * shapes[(2048.0, 2048.0)]  # 2048 cached keys cost: they are there
    decodes = {r["context"] for r in read_shared_profiles(PROFILES, "RTX4090") if r["operator"] == "decode_attention"}
    assert 16384.0 in decodes and 16383.0 not in decodes


@pytest.mark.skipif(not LSS_4090.is_file(), reason="shared kernel profiles absent")
def test_shipped_rtx_4090_prices_the_waves_of_long_chunks():
    # the shapes where the waves matter: chunks of 512-2048 tokens over 16k cached keys (the longest row
    # alone prices them 14-28 % off); the shipped fit is within 5 % of each measurement
    rows = [r for r in read_shared_profiles(PROFILES, "RTX4090")
            if r["operator"] == "prefill_attention" and r["context"] == 16384 and r["chunk"] >= 256]
    errors = [abs(p / r["measured_s"] - 1) for p, r in zip(predict(rows, shipped_calibration("rtx-4090")), rows)]
    assert len(errors) == 4 and max(errors) < 0.05


def _write_context(root: Path, system: str, batch: list, isl: list) -> None:
    write_attention_table(root, system, "context", batch, "isl", isl)


def test_prefill_rows_whose_tensors_fit_in_l2_are_the_l2_family(tmp_path):
    # l40s, 96 MiB of L2; 32 + 8 heads of 128: Q, O, K, V = 20 KiB a token. 4096 tokens (80 MiB) fit,
    # 8192 (160 MiB) do not; a single-token row is a decode whatever its size
    assert prefill_bytes(16, 256, 32, 8, 128) == 4096 * 20 * 1024 <= L2_BYTES["l40s"][0]
    _write_context(tmp_path, "l40s", [16, 32, 64], [256, 256, 1])
    ops = [r["operator"] for r in read_table(tmp_path, "l40s", "context_attention")]
    assert ops == ["prefill_attention_l2", "prefill_attention", "prefill_attention"]


def test_serving_prices_prefill_from_the_dram_fit():
    cal = shipped_calibration("l40s")
    assert "prefill_attention_l2@32/8/128" in cal.coeffs
    row = {"operator": "prefill_attention", "chunk": 512, "num_heads": 32.0, "num_kv_heads": 8.0, "head_dim": 128.0}
    assert coeffs_for_row(cal.coeffs, row) == cal.coeffs["prefill_attention@32/8/128"]
