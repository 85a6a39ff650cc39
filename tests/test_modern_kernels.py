"""Modern kernels: AIConfigurator's MLA / FP8 GEMM / MoE tables read, fitted (modern_fit.py) and priced
(modern_kernels.py, layer_ops.py)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_cost_model import get_model, make_cost_model, mla
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import ConfigError
from kernels_cost_model.model_shapes import attention_params
from kernels_cost_model.modern_kernels import DATA_DIR, gemm_op, load_modern, mla_kernels, weight_variant
from kernels_cost_model.operators import MatmulOp, padded_rows

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "kernel_profiles"
needs_profiles = pytest.mark.skipif(not (PROFILES / "aiconfigurator").is_dir(), reason="../shared data absent")
DSV3 = get_model("deepseek-v3")


def decode(n: int, ctx: int) -> BatchShape:
    return BatchShape(num_new_tokens=[1] * n, num_context_tokens=[ctx] * n, num_sampled=n)


# ----- shipped fits ----------------------------------------------------------------------------------
def test_every_shipped_fit_names_its_source_and_held_out_error():
    files = sorted(DATA_DIR.glob("*.json"))
    assert len(files) >= 9
    for path in files:
        raw = json.loads(path.read_text())
        assert raw["provenance"]["licence"].startswith("measurements: ai-dynamo/aiconfigurator")
        for kind in ("mla", "gemm", "moe", "gdn"):
            for variant, fit in raw.get(kind, {}).items():
                assert fit["sources"] and all("aiconfigurator" in s and "vLLM" in s for s in fit["sources"])
                assert fit["holdout_samples"] > 0 and 0 <= fit["holdout_error"]["median"] < 0.5, (path, variant)


def test_hopper_mla_fits_are_accurate_on_held_out_shapes():
    for gpu in ("h100-sxm", "h200"):
        raw = load_modern(gpu)["_raw"]["mla"]
        for phase in ("context", "generation"):
            assert raw[f"{phase}/bfloat16/fp8_block"]["holdout_error"]["median"] < 0.08


def test_mla_module_prefill_prices_its_attention_kernel_apart_from_its_projections():
    for gpu in ("h100-sxm", "h200", "b200", "b300", "gb200", "gb300"):
        for variant, fit in load_modern(gpu)["_raw"]["mla"].items():
            if variant.startswith("context/"):
                assert fit["coeffs"]["mla"]["s_per_attention_flop"] > 0, (gpu, variant)
                assert fit["holdout_error"]["median"] < 0.05, (gpu, variant)
    kernel_only = load_modern("a100-sxm-80gb")["mla"]["context/bfloat16/bfloat16"]["mla"]
    assert kernel_only.s_per_attention_flop == 0  # one kernel, one rate
    # the split: the projections' FLOPs and the attention's add up to the module's
    flops, nbytes = mla.context_cost(DSV3, 16, 4096, 4096 * 4097 / 2, 0.0, 2, 2, "module")
    rest, same_bytes, attention = mla.split_context(DSV3, 16, 4096, 4096 * 4097 / 2, 0.0, 2, 2, "module")
    assert (rest + attention, same_bytes) == (flops, nbytes)
    assert attention == mla.context_attention_flops(DSV3, 16, 4096 * 4097 / 2) > 0
    assert mla.split_context(DSV3, 16, 4096, 4096 * 4097 / 2, 0.0, 2, 2, "kernel")[2] == 0.0


def test_mla_prefill_is_fitted_on_the_kernel_vllm_serves_it_with():
    from kernels_cost_model.modern_fit import _served_rows
    row = dict(batch=1, isl=4096, heads=16)
    rows = [dict(row, kernel=k) for k in ("FLASH_ATTN", "TRTLLM_RAGGED", "FLASHMLA")]
    assert [x["kernel"] for x in _served_rows(rows, "context")] == ["FLASH_ATTN"]  # the selector's first
    assert [x["kernel"] for x in _served_rows(rows[1:], "context")] == ["TRTLLM_RAGGED"]
    assert len(_served_rows(rows, "generation")) == 3
    assert [x["kernel"] for x in _served_rows([dict(row, kernel="vllm_triton_mla")], "context")] == \
        ["vllm_triton_mla"]  # a kernel-only table of one kernel (a100) is kept whole


# ----- FP8 GEMMs: rows padded to the kernel's M tile ---------------------------------------------------
def test_fp8_gemm_kernels_compute_their_rows_padded_to_the_m_tile():
    assert [padded_rows(m, 256) for m in (1, 16, 17, 64, 65, 129, 256, 257, 513)] == \
        [16, 16, 32, 64, 128, 256, 256, 512, 768]
    assert (padded_rows(129, 128), padded_rows(200, 64), padded_rows(0.5, 64)) == (256, 256, 16)


@given(rows=st.floats(0.01, 20000), extra=st.floats(0, 5000), step=st.sampled_from([0, 64, 128, 256]))
def test_a_padded_gemm_never_gets_cheaper_with_more_rows(rows, extra, step):
    op = MatmulOp(4096 * 4096, 8192, 1e-15, 3e-13, 5e-6, 30.0, step)
    assert op.time(rows + extra, 1.0) >= op.time(rows, 1.0)


def test_every_fp8_gemm_fit_records_its_row_step_and_no_block_scaled_fit_ships():
    for path in sorted(DATA_DIR.glob("*.json")):
        raw = json.loads(path.read_text())
        assert "fp8_block" not in raw["gemm"] and "fp8_block" in raw["provenance"]["gemm_not_fitted"]
        for fit in raw["gemm"].values():
            errors = fit["row_step_fit_error"]
            assert fit["row_step"] in (0, 64, 128, 256)
            assert errors[str(fit["row_step"])] == min(errors.values()) == fit["fit_error"]["median"]


def test_an_fp8_gemm_one_row_past_a_tile_costs_the_next_tile_on_h100():
    like = MatmulOp(4096 * 14336, 4096 + 14336, 1e-15, 3e-13, 0.0, 0.0)
    op = gemm_op("h100-sxm", "fp8", like, 14336, 4096)
    step = load_modern("h100-sxm")["row_step"]["fp8"]
    assert op.row_step == step > 0
    assert op.time(step + 1, 1.0) > 1.3 * op.time(step, 1.0)  # compute-bound: 2x the rows computed
    assert op.time(2 * step, 1.0) == op.time(step + 1, 1.0)


@needs_profiles
def test_h100_fp8_gemm_refits_to_its_recorded_held_out_error():
    from kernels_cost_model.aiconfigurator_modern import gemm_rows
    from kernels_cost_model.modern_fit import _fit_gemm_rows
    shipped = load_modern("h100-sxm")["_raw"]["gemm"]["fp8"]
    refit = _fit_gemm_rows(list(gemm_rows(PROFILES, "h100_sxm", "fp8")), shipped["row_step"])
    assert refit["holdout_error"] == shipped["holdout_error"] and refit["coeffs"] == shipped["coeffs"]
    assert shipped["holdout_error"]["median"] < 0.05


def test_mla_generation_fits_price_kv_from_dram_and_keep_the_l2_replays_apart():
    for path in sorted(DATA_DIR.glob("*.json")):
        mla_fits = json.loads(path.read_text())["mla"]
        for key, fit in mla_fits.items():
            if key.startswith("generation/"):
                assert f"generation_l2/{key.split('/', 1)[1]}" in mla_fits, (path, key)
                assert fit["holdout_error"]["median"] < 0.05, (path, key)


@needs_profiles
def test_h200_mla_refits_with_its_generation_rows_split_at_the_l2():
    from kernels_cost_model.modern_fit import fit_mla
    refit, shipped = fit_mla(PROFILES, "h200_sxm"), load_modern("h200")["_raw"]["mla"]
    assert {k: (v["coeffs"], v["holdout_error"]) for k, v in refit.items()} == \
        {k: (v["coeffs"], v["holdout_error"]) for k, v in shipped.items()}  # the recorded error reproduces
    fits = load_modern("h200")["mla"]
    dram, l2 = fits["generation/bfloat16/bfloat16"]["mla@16"], fits["generation_l2/bfloat16/bfloat16"]["mla@16"]
    flops, nbytes = mla.generation_cost(DSV3, 16, 8, 8 * 1001, 2, 2, "module")  # 9 MB of latent KV
    assert dram.time(flops, nbytes, 8, 8) > l2.time(flops, nbytes, 8, 8)  # served from DRAM: slower


# ----- MLA cost terms --------------------------------------------------------------------------------
def test_mla_weights_at_all_heads_are_the_attention_parameters():
    assert mla.weight_elements(DSV3, DSV3.num_heads) == attention_params(DSV3)
    assert mla.weight_elements(DSV3, 16) < mla.weight_elements(DSV3, 128)


def test_mla_decode_reads_the_576_wide_latent_once_per_key():
    # kernel scope: bytes = keys x (512 + 64) x kv bytes + the few query/output activations
    flops, nbytes = mla.generation_cost(DSV3, 16, batch=1, keys=1000, kv_bytes=1, weight_bytes=1, scope="kernel")
    assert flops == 2 * 16 * (512 + 64 + 512) * 1000
    assert nbytes == 576 * 1000 + 2 * 16 * (2 * 512 + 64)


def test_fp8_kv_makes_long_context_decode_cheaper_on_h200():
    bf16, fp8 = mla_kernels("h200", DSV3, 16, "auto"), mla_kernels("h200", DSV3, 16, "fp8")
    assert bf16.scope == fp8.scope == "module"
    assert fp8.decode(128, 128 * 32000) < 0.9 * bf16.decode(128, 128 * 32000)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 512), ctx=st.integers(1, 60000), extra=st.integers(1, 5000))
def test_measured_mla_grows_with_keys_and_rows(rows, ctx, extra):
    k = mla_kernels("h200", DSV3, 16)
    assert k.decode(rows, rows * (ctx + extra)) > k.decode(rows, rows * ctx)
    assert k.decode(rows + 1, (rows + 1) * ctx) >= k.decode(rows, rows * ctx)
    assert k.prefill(ctx + extra, 0.5 * (ctx + extra) ** 2, 0, 1) > k.prefill(ctx, 0.5 * ctx ** 2, 0, 1)


# ----- wired into the cost model -----------------------------------------------------------------------
def test_deepseek_on_h200_prices_mla_fp8_and_moe_from_the_fits():
    cm = make_cost_model("deepseek-v3", "h200", 8)
    assert cm.mla is not None and cm.mla.heads == 16 and cm.mla.weight_bytes == 1.0
    b = cm.breakdown(decode(64, 2000))
    assert b["qkv_proj"] == b["o_proj"] == 0.0 and b["decode_attention"] > 0  # module fit holds projections
    fits = load_modern("h200")["moe"]["fp8_block"]
    assert cm.base.fused_moe.coeffs in fits.values()
    uncal = make_cost_model("deepseek-v3", "h200", 8, calibration=None)
    assert uncal.mla is None and uncal.breakdown(decode(64, 2000))["qkv_proj"] > 0


def test_weight_variants_follow_the_quantization_config():
    assert weight_variant(DSV3) == "fp8_block"
    assert weight_variant(get_model("mistral-small-24b-fp8")) == "fp8"
    assert weight_variant(get_model("gpt-oss-120b")) == "w4a16_mxfp4"
    assert weight_variant(get_model("gemma-3-27b")) == "bfloat16"


def test_measured_fp8_gemms_beat_bf16_on_a_compute_bound_step():
    big = BatchShape(num_new_tokens=[8192], num_context_tokens=[0], num_sampled=1)
    bf16, fp8 = make_cost_model("mistral-small-24b", "h100"), make_cost_model("mistral-small-24b-fp8", "h100")
    assert fp8.breakdown(big)["mlp"] < 0.8 * bf16.breakdown(big)["mlp"]
    one = decode(1, 100)  # weight-read bound: one byte per weight instead of two
    assert fp8.breakdown(one)["mlp"] < 0.75 * bf16.breakdown(one)["mlp"]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 96), ctx=st.integers(1, 30000), grow=st.integers(1, 3000), chunk=st.integers(0, 2048))
def test_deepseek_step_is_monotone_in_context_and_batch(n, ctx, grow, chunk):
    cm = make_cost_model("deepseek-v3", "h200", 8)
    rows, ctxs = [1] * n, [ctx] * n
    if chunk > 1:
        rows, ctxs = rows + [chunk], ctxs + [0]
    base = cm.step_time(BatchShape(rows, ctxs, n + (chunk > 1)))
    assert cm.step_time(BatchShape(rows, [c + grow for c in ctxs], n + (chunk > 1))) >= base
    assert cm.step_time(BatchShape(rows + [1], ctxs + [ctx], n + 1 + (chunk > 1))) >= base


def test_a100_uses_the_kernel_only_mla_table():
    k = mla_kernels("a100-sxm-80gb", DSV3, 16)
    assert k is not None and k.scope == "kernel" and k.weight_bytes == 2.0
    assert mla_kernels("a100-sxm-80gb", DSV3, 16, "fp8") is None  # no fp8 KV measured there


# ----- readers and the fit script (need ../shared) -----------------------------------------------------
@needs_profiles
def test_readers_stream_mla_fp8_and_moe_rows():
    from kernels_cost_model.aiconfigurator_modern import gemm_rows, mla_rows, moe_rows
    rows = list(mla_rows(PROFILES, "h200_sxm", "generation"))
    assert {(r["kv_dtype"], r["gemm"]) for r in rows} == {("bfloat16", "bfloat16"), ("bfloat16", "fp8_block"),
                                                          ("fp8", "bfloat16"), ("fp8", "fp8_block")}
    assert all(r["seconds"] > 0 and r["scope"] == "module" and "vLLM 0.24.0" in r["source"] for r in rows)
    first = next(iter(gemm_rows(PROFILES, "h100_sxm", "fp8_block")))
    assert min(first["n"], first["k"]) >= 512 and first["kernel"]
    moe = next(iter(moe_rows(PROFILES, "h200_sxm", "fp8_block")))
    assert moe["experts"] >= moe["top_k"] > 0
    with pytest.raises(ConfigError, match="unknown AIConfigurator system"):
        list(mla_rows(PROFILES, "tpu_v5", "context"))


@needs_profiles
def test_refit_reproduces_the_shipped_h200_mla_coefficients():
    from kernels_cost_model.modern_fit import fit_mla
    fresh = fit_mla(PROFILES, "h200_sxm")
    shipped = load_modern("h200")["_raw"]["mla"]
    assert fresh.keys() == shipped.keys()
    for variant, fit in fresh.items():
        assert fit["coeffs"] == shipped[variant]["coeffs"]


def test_a_malformed_mla_table_names_the_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    from kernels_cost_model.aiconfigurator_tables import MalformedTableError
    from kernels_cost_model.aiconfigurator_modern import mla_rows
    folder = tmp_path / "aiconfigurator" / "h200_sxm" / "mla" / "vllm" / "0.24.0"
    folder.mkdir(parents=True)
    table = {"version": ["0.24.0"], "kv_cache_dtype": ["int3"], "gemm_type": ["bfloat16"], "num_heads": [16],
             "batch_size": [1], "isl": [1], "step": [8], "latency": [0.1]}
    pq.write_table(pa.table(table), folder / "mla_generation_module_perf.parquet")
    with pytest.raises(MalformedTableError, match="kv_cache_dtype"):
        list(mla_rows(tmp_path, "h200_sxm", "generation"))


def test_block_fp8_gemms_carry_no_eager_launch_latency():
    # h200's fp8_block table was timed without CUDA graphs (~59 us at m=1 for n=512, k=7168); served from
    # graphs the shared expert's up-projection of one token costs about the per-tensor FP8 GEMM's 10 us
    cm = make_cost_model("deepseek-v3", "h200", 8)
    up, _down = cm.shared_mlp
    assert up.time(1, 2) < 20e-6
    assert cm.base.qkv.overhead_s < 20e-6


def test_qwen3_next_prices_its_linear_layers_from_the_gdn_fits():
    cm = make_cost_model("qwen3-next-80b-a3b", "h200", 2)
    assert cm.gdn is not None and cm.gdn.heads == (8, 128, 16, 128)  # 16 key / 32 value heads over 2 GPUs
    assert make_cost_model("qwen3-next-80b-a3b", "h200", 2, calibration=None).gdn is None
    # decode reads each request's state once, whatever its context: the cost follows requests, not keys
    assert cm.gdn.decode(256) > 4 * cm.gdn.decode(32)
    assert cm.gdn.prefill([8192]) > cm.gdn.prefill([1024])


def test_gdn_intermediates_match_a_hand_count():
    from kernels_cost_model.modern_kernels import gdn_intermediate_bytes, gdn_prefill_terms
    # 64 tokens, one value head of 128 x 128: per token an fp32 and a bf16 row of 64 (K K^T and its
    # inverse), w, u and the new values (bf16, 128 each); one chunk's bf16 state of 128 x 128
    assert gdn_intermediate_bytes(64, 1, 128, 1, 128) == 64 * (6 * 64 + 3 * 256) + 2 * 128 * 128
    # chunks of 64: 65 tokens take two; the longest sequence is the serial path
    assert gdn_prefill_terms([65, 64, 1], 128, 1, 128, 1e12) == (2.0, 0.0)
    assert gdn_prefill_terms([64], 128, 1, 128, 100_000) == (1.0, 6_496.0)


def test_gdn_prefill_pays_a_long_sequences_serial_chunks_and_spills_beyond_l2():
    cm = make_cost_model("qwen3-next-80b-a3b", "h200", 2)
    gdn = cm.gdn
    assert gdn.context.s_per_key > 0 and gdn.context.s_per_spilled_byte > 0 and gdn.l2_bytes == 50 * 2**20
    # the same tokens as one sequence take 8x the chunks one after another
    assert gdn.prefill([8192]) > 1.5 * gdn.prefill([1024] * 8)
    # L40S (96 MB of L2), 8 key / 16 value heads: AIConfigurator measured 307 us for 4 x 1,024 tokens and
    # 1,090 us for 8 x 1,024, whose intermediates (218 MB against 109) spill twice as far beyond the L2
    l40s = make_cost_model("qwen3-next-80b-a3b", "l40s", 2).gdn
    assert l40s.prefill([1024] * 8) > 2.5 * l40s.prefill([1024] * 4)
    assert make_cost_model("qwen3-next-80b-a3b", "a100", 2).gdn is None  # no GDN table: the roofline prices it


@functools.cache
def _qwen3_next_gdn(gpu: str):
    return make_cost_model("qwen3-next-80b-a3b", gpu, 2).gdn


@given(lengths=st.lists(st.integers(2, 40_000), min_size=1, max_size=8), row=st.integers(0, 7),
       extra=st.integers(1, 5_000), gpu=st.sampled_from(["h200", "l40s", "rtx-pro-6000", "b200"]))
def test_gdn_prefill_never_cheaper_with_more_tokens(lengths, row, extra, gpu):
    gdn = _qwen3_next_gdn(gpu)
    longer = list(lengths)
    longer[row % len(longer)] += extra
    assert gdn.prefill(longer) >= gdn.prefill(lengths)


@needs_profiles
def test_gdn_cases_sum_both_kernels_and_refit_to_the_shipped_coefficients():
    from kernels_cost_model.aiconfigurator_modern import gdn_rows
    from kernels_cost_model.modern_fit import fit_gdn
    rows = gdn_rows(PROFILES, "h200_sxm")
    assert {r["phase"] for r in rows} == {"context", "generation"} and all(r["seconds"] > 0 for r in rows)
    shipped = load_modern("h200")["_raw"]["gdn"]
    assert {k: (v["coeffs"], v["holdout_error"]) for k, v in fit_gdn(PROFILES, "h200_sxm").items()} == \
        {k: (v["coeffs"], v["holdout_error"]) for k, v in shipped.items()}


def test_mixed_mla_step_pays_the_module_launches_once():
    cm = make_cost_model("deepseek-v3", "h200", 8)
    attn = lambda b: cm.breakdown(b)["prefill_attention"] + cm.breakdown(b)["decode_attention"]  # noqa: E731
    pf, dec = BatchShape([512], [0], 1), decode(32, 3000)
    mixed = BatchShape([512] + [1] * 32, [0] + [3000] * 32, 33)
    shared = 61 * min(cm.mla.context.overhead_s, cm.mla.generation.overhead_s)
    reread = 61 * (cm.mla.decode(32, 32 * 3001) - cm.mla.decode(32, 32 * 3001, read_weights=False))
    assert attn(mixed) == pytest.approx(attn(pf) + attn(dec) - shared - reread)   # weights read once too
    assert attn(mixed) > max(attn(pf), attn(dec))


def test_a_mixed_mla_step_reads_the_module_weights_once():
    """Prefill and decode rows in one step run the MLA projections once: the decode side is priced
    without the weight reads the prefill side already made."""
    cm = make_cost_model("deepseek-v3", "h200", 8)
    k, layers = cm.mla, cm.counts["full_attention"]
    n, ctx, chunk = 8, 2000, 512
    mixed = cm.breakdown(BatchShape([1] * n + [chunk], [ctx] * n + [0], n + 1))
    pf = k.prefill(chunk, chunk * (chunk + 1) / 2, 0, 1)
    with_w, without_w = k.decode(n, n * (ctx + 1)), k.decode(n, n * (ctx + 1), read_weights=False)
    weights_s = k.weight_bytes * mla.weight_elements(DSV3, 16) * k.generation.s_per_byte
    assert 0.5 * weights_s < with_w - without_w <= weights_s * (1 + 1e-9)  # mostly weight-read bound
    shared = min(k.context.overhead_s, k.generation.overhead_s)
    expected = layers * (pf + without_w - shared)
    assert mixed["prefill_attention"] + mixed["decode_attention"] == pytest.approx(expected, rel=1e-9)
    alone = cm.breakdown(decode(n, ctx))["decode_attention"]
    assert alone == pytest.approx(layers * with_w)                       # decode alone still reads them


# ----- terms added for the held-out target (issue #14) -----------------------------------------------
def test_mla_prefill_hidden_states_spill_only_beyond_the_l2():
    l2 = 96 * 2**20
    knee = l2 / (2 * DSV3.hidden_size)  # tokens whose bf16 hidden states fill the L2
    assert mla.context_spilled_bytes(DSV3, knee - 1, l2) == 0.0
    assert mla.context_spilled_bytes(DSV3, knee + 1000, l2) == pytest.approx(2 * DSV3.hidden_size * 1000)
    spills = [mla.context_spilled_bytes(DSV3, n, l2) for n in (8192, 16384, 32768)]
    assert spills == sorted(spills) and spills[2] - spills[1] == 2 * (spills[1] - spills[0])  # linear
    assert mla.context_spilled_bytes(DSV3, 1e6, l2, "kernel") == 0.0  # a kernel-only fit has no projections


def test_mla_prefill_fits_price_the_spill_and_serving_pays_it():
    for gpu in ("l40s", "rtx-pro-6000"):
        for variant, fit in load_modern(gpu)["_raw"]["mla"].items():
            if variant.startswith("context/"):
                assert fit["coeffs"]["mla"]["s_per_spilled_byte"] > 0, (gpu, variant)
                assert fit["holdout_error"]["median"] < 0.035, (gpu, variant)
    kernels = mla_kernels("l40s", DSV3, 1)
    assert kernels.l2_bytes == 96 * 2**20 and kernels.context.s_per_spilled_byte > 0
    # past the knee (~7 k tokens) a token costs more than before it: the spilled bytes add to the GEMMs
    per_token = lambda n: kernels.prefill(n, n * (n + 1) / 2 / 1e3, 0.0, 1) / n  # noqa: E731 (short rows)
    assert per_token(65536) > per_token(4096)


def test_gdn_chunk_rows_grow_to_one_chunk_then_stop():
    from kernels_cost_model.modern_kernels import GDN_CHUNK, gdn_chunk_rows
    rows = [gdn_chunk_rows([n]) for n in range(1, 3 * GDN_CHUNK)]
    assert rows == sorted(rows) and rows[0] == 1.0 and rows[GDN_CHUNK - 1] == GDN_CHUNK
    assert set(rows[GDN_CHUNK - 1:]) == {GDN_CHUNK}  # a full chunk and beyond: the loop is one chunk long
    assert gdn_chunk_rows([3, 40, 9]) == 40 and gdn_chunk_rows([]) == 0.0  # the launch waits for its fullest


def test_gdn_prefill_of_one_short_sequence_grows_with_its_rows():
    for gpu in ("l40s", "rtx-pro-6000", "h100-sxm"):
        assert load_modern(gpu)["_raw"]["gdn"]["context"]["coeffs"]["gdn"]["s_per_chunk_row"] > 0, gpu
        assert load_modern(gpu)["_raw"]["gdn"]["context"]["holdout_error"]["median"] < 0.05, gpu
    gdn = make_cost_model("qwen3-next-80b-a3b", "l40s", 2).gdn
    # L40S measured 19 us at 1 token and 31 us at 64 (2 key / 4 value heads); one row adds ~0.2 us
    assert gdn.prefill([64]) - gdn.prefill([1]) > 63 * 0.1e-6
    assert gdn.prefill([128]) - gdn.prefill([64]) < gdn.prefill([64]) - gdn.prefill([1])


@needs_profiles
@pytest.mark.parametrize("system,gpu", [("l40s", "l40s"), ("rtx_pro_6000_server", "rtx-pro-6000")])
def test_mla_and_gdn_refit_to_their_recorded_held_out_errors(system, gpu):
    from kernels_cost_model.modern_fit import fit_gdn, fit_mla
    shipped = load_modern(gpu)["_raw"]
    for kind, fresh in (("mla", fit_mla(PROFILES, system)), ("gdn", fit_gdn(PROFILES, system))):
        assert {k: (v["coeffs"], v["holdout_error"]) for k, v in fresh.items()} == \
            {k: (v["coeffs"], v["holdout_error"]) for k, v in shipped[kind].items()}, (gpu, kind)


def test_modern_fit_names_a_folder_without_the_tables_instead_of_fitting_nothing(tmp_path, capsys):
    """docs/models.md's `python -m kernels_cost_model.modern_fit ../shared/data/kernel_profiles`, run from
    another folder, used to print nothing and exit 0; --help printed nothing either."""
    from kernels_cost_model.modern_fit import main
    assert main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert "no AIConfigurator tables under" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert main(["--help"]) == 0 and "python -m kernels_cost_model.modern_fit" in capsys.readouterr().out
