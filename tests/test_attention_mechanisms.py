"""Attention as vLLM runs it: a one-token prefill is a decode; a causal launch pays for its longest row."""
from dataclasses import replace

import pytest

from kernels_cost_model import make_cost_model
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.calibration import Calibration, costs, fit_profile, predict, shipped_calibration
from kernels_cost_model.profile_schema import validate_row
from kernels_cost_model.roofline import Coeffs, operator_keys, single_token_prefill
from kernels_cost_model.roofline_fit import fit_family
from kernels_cost_model.shape_keys import coeffs_for_row

PREFILL = Coeffs(2e-15, 4e-13, 9e-6, 40.0, 3e-7, 2e-9)
DECODE = Coeffs(1e-14, 4.5e-13, 8e-6, 0.0, 5e-8)


def _row(**kw) -> dict:
    base = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "measured_s": 1.0,
            "device": "h100-sxm", "source": "synthetic"}
    return validate_row({**base, **kw})


def _prefill_rows(truth: Calibration) -> list[dict]:
    rows = [_row(operator="prefill_attention", batch=b, chunk=c, context=p)
            for b in (1, 4, 32) for c in (16, 128, 1024, 4096) for p in (0, 2048)]
    for r, t in zip(rows, predict(rows, truth)):
        r["measured_s"] = float(t)
    return rows


def test_longest_row_keys_are_context_plus_chunk_for_prefill_only():
    assert operator_keys(_row(operator="prefill_attention", batch=8, chunk=512, context=1000)) == 1512
    assert operator_keys(_row(operator="decode_attention", batch=8, context=1000)) == 1001
    assert operator_keys(_row(operator="matmul", m=8, n=64, k=64)) == 0


def test_fit_recovers_the_cost_per_key_of_the_longest_row():
    truth = Calibration("truth", {f: PREFILL for f in ("matmul", "elementwise", "prefill_attention",
                                                      "decode_attention", "all_reduce")})
    got = fit_family(*costs(_prefill_rows(truth)), robust=False)
    assert got.s_per_key == pytest.approx(PREFILL.s_per_key, rel=1e-4)
    assert got.s_per_seq == pytest.approx(PREFILL.s_per_seq, rel=1e-4)


def test_a_one_token_prefill_is_priced_and_fitted_as_a_decode():
    one = _row(operator="prefill_attention", batch=64, chunk=1, context=0)
    assert single_token_prefill(one) and not single_token_prefill({**one, "chunk": 2})
    coeffs = {"prefill_attention": PREFILL, "decode_attention": DECODE}
    assert coeffs_for_row(coeffs, one) is DECODE
    in_l2 = replace(DECODE, s_per_byte=1e-13)       # one key per request: read from L2 where the GPU splits it
    assert coeffs_for_row({**coeffs, "decode_attention_l2": in_l2}, one) is in_l2
    truth = Calibration("truth", {f: PREFILL for f in ("matmul", "elementwise", "prefill_attention",
                                                      "decode_attention", "all_reduce")})
    rows = _prefill_rows(truth)
    odd = {**one, "measured_s": 1.0}                 # a decode-path time far off the prefill roofline
    fits = [fit_profile(r, "h100-sxm", fallback=truth).coeffs["prefill_attention"] for r in (rows + [odd], rows)]
    assert fits[0] == fits[1]


def test_serving_pays_the_longest_row_once_per_launch():
    cal = shipped_calibration("h100-sxm")

    def with_key_cost(prefill: float, decode: float) -> Calibration:
        def cost(key: str) -> float:
            return prefill if key.startswith("prefill_attention") else decode
        coeffs = {k: replace(c, s_per_key=cost(k)) if "attention" in k else c for k, c in cal.coeffs.items()}
        return Calibration(cal.device, coeffs, cal.provenance, cal.curves)

    def step(prefill: float, decode: float, batch: BatchShape) -> float:
        cm = make_cost_model("llama-3.1-8b", "h100", calibration=with_key_cost(prefill, decode), cpu_overhead=False,
                             clocks="burst")
        return cm.step_time(batch)

    mixed = BatchShape(num_new_tokens=[300, 2000, 1, 1], num_context_tokens=[5000, 0, 700, 90], num_sampled=3)
    # 32 layers x the longest prefill row's keys (5000 + 300); the decodes' path (701 keys) is shorter
    assert step(1e-9, 1e-9, mixed) - step(0.0, 0.0, mixed) == pytest.approx(32 * 1e-9 * 5300, rel=1e-6)
    decodes = BatchShape(num_new_tokens=[1, 1, 1], num_context_tokens=[700, 9000, 90], num_sampled=3)
    assert step(0.0, 1e-9, decodes) - step(0.0, 0.0, decodes) == pytest.approx(32 * 1e-9 * 9001, rel=1e-6)
    idle = BatchShape(num_new_tokens=[1, 0, 1], num_context_tokens=[700, 9000, 90], num_sampled=2)
    assert step(0.0, 1e-9, idle) - step(0.0, 0.0, idle) == pytest.approx(32 * 1e-9 * 701, rel=1e-6)
    # a chunk holding the longest context: its path is priced at the prefill fit's key cost (here 0), the
    # decode's own (701 keys) at decode's. (A 2-token chunk there would be priced as the decode it could
    # have been: over 9,000 cached keys it reads as much cache as one, and that floor binds.)
    chunk = BatchShape(num_new_tokens=[512, 1], num_context_tokens=[9000, 700], num_sampled=2)
    assert step(0.0, 1e-9, chunk) - step(0.0, 0.0, chunk) == pytest.approx(32 * 1e-9 * 701, rel=1e-6)
