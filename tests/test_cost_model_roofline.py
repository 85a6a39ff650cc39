"""Each roofline term of a step against a hand computation, with simple known coefficients."""
import dataclasses

import pytest

from kernels_cost_model import Calibration, Coeffs, make_cost_model
from kernels_cost_model.errors import ConfigError
from kernels_cost_model.roofline import FAMILIES, decode_attention, matmul, prefill_attention, roofline
from kernels_cost_model.batch import BatchShape

A, B, C = 1e-15, 1e-12, 1e-6  # seconds per FLOP, per byte, per launch


def simple_calibration(tile_rows: float = 0.0) -> Calibration:
    return Calibration("test", {f: Coeffs(A, B, C, tile_rows) for f in FAMILIES})


def rf(flops, nbytes):
    return max(flops * A, nbytes * B) + C


def model(name="llama-3.1-8b", tp=1, **kw):
    """The hand computations below use the unpadded token count, every decode at its own context (the
    H100's measured decode imbalance is tested in test_decode_imbalance.py) and the kernels' own clocks
    (the power cap's in test_power_cap.py)."""
    cm = make_cost_model(name, "h100", tp, calibration=simple_calibration(**kw), cpu_overhead=False,
                         enforce_eager=True, clocks="burst")
    return dataclasses.replace(cm, decode_imbalance=None)


# llama-3.1-8b: H=4096, L=32, 32 heads, 8 KV heads, head_dim 128, I=14336, V=128256, bf16
H, L, Q, KV, I, V, D = 4096, 32, 4096, 1024, 14336, 128256, 2
BATCH = BatchShape([100, 1, 1], [50, 200, 300], num_sampled=2)
T = 102


def mm(m, k, n):
    return rf(2 * m * k * n, D * (m * k + k * n + m * n))


def test_matmul_terms():
    bd = model().breakdown(BATCH)
    assert bd["qkv_proj"] == pytest.approx(L * mm(T, H, Q + 2 * KV))
    assert bd["o_proj"] == pytest.approx(L * mm(T, Q, H))
    assert bd["mlp"] == pytest.approx(L * (mm(T, H, 2 * I) + mm(T, I, H)))
    assert bd["lm_head"] == pytest.approx(mm(2, H, V))  # sampled rows only
    assert bd["moe_routing"] == 0.0 and bd["all_reduce"] == 0.0 and bd["cpu"] == 0.0


def test_attention_terms_one_launch():
    bd = model().breakdown(BATCH)
    pairs_pf = 100 * 50 + 100 * 101 / 2
    c_pf, m_pf = 4 * 128 * 32 * pairs_pf * A, D * (2 * 100 * Q + 2 * 150 * KV) * B
    keys = 201 + 301
    c_dec, m_dec = 4 * 128 * 32 * keys * A, D * (2 * 2 * Q + 2 * keys * KV) * B
    total = max(c_pf + c_dec, m_pf + m_dec) + C
    assert bd["prefill_attention"] + bd["decode_attention"] == pytest.approx(L * total)
    share = max(c_pf, m_pf) / (max(c_pf, m_pf) + max(c_dec, m_dec))
    assert bd["prefill_attention"] == pytest.approx(L * total * share)


def test_attention_formulas_match_profile_helpers():
    flops, nbytes = prefill_attention(100, 50, 1, 32, 8, 128, 2)
    assert flops == 4 * 128 * 32 * (100 * 50 + 100 * 101 / 2)
    assert nbytes == 2 * (2 * 100 * 4096 + 2 * 150 * 1024)
    flops, nbytes = decode_attention(200, 3, 32, 8, 128, 2)
    assert flops == 3 * 4 * 128 * 32 * 201 and nbytes == 3 * 2 * (2 * 4096 + 2 * 201 * 1024)
    assert matmul(3, 5, 7, 2) == (2 * 3 * 5 * 7, 2 * (3 * 7 + 7 * 5 + 3 * 5))


def test_norm_and_activation_terms():
    bd = model().breakdown(BATCH)
    per_layer = (2 * (D * (2 * T * H + H) * B + C) + 2 * (D * 3 * T * H * B + C)
                 + D * 3 * T * I * B + C + D * 2 * T * (Q + KV) * B + C)
    once = D * 2 * T * H * B + C + D * (2 * T * H + H) * B + C  # embedding, final norm
    assert bd["norms_activations"] == pytest.approx(L * per_layer + once)


def test_tensor_parallel_splits_and_all_reduce():
    bd = model(tp=2).breakdown(BATCH)
    assert bd["qkv_proj"] == pytest.approx(L * mm(T, H, (Q + 2 * KV) / 2))
    # two per layer and one after the vocabulary-parallel embedding
    assert bd["all_reduce"] == pytest.approx((2 * L + 1) * (2 * (2 - 1) / 2 * D * T * H * B + C))
    # the sampled rows' logits are all-gathered from the vocabulary shards
    assert bd["lm_head"] == pytest.approx(mm(2, H, V / 2) + (2 - 1) / 2 * D * 2 * V * B + C)


def test_tile_rows_penalise_small_matmuls():
    bd = model(tile_rows=50.0).breakdown(BatchShape([4096], [0], 1))
    flops, nbytes = 2 * 4096 * H * (Q + 2 * KV), D * (4096 * H + H * (Q + 2 * KV) + 4096 * (Q + 2 * KV))
    assert bd["qkv_proj"] == pytest.approx(L * (max(flops * A * (1 + 50 / 4096), nbytes * B) + C))
    assert roofline(0.0, 10.0, 1.0, Coeffs(A, B, C, 5.0)) == pytest.approx(10 * B + C)


def test_moe_touches_expected_experts():
    cm = model("mixtral-8x7b")
    h, inter, e, k = 4096, 14336, 8, 2
    t = 3
    active = e * (1 - (1 - k / e) ** t)
    per = t * k / active
    up = (max(2 * per * h * 2 * inter * A, D * (per * (h + 2 * inter) + h * 2 * inter) * B)) * active + C
    down = (max(2 * per * inter * h * A, D * (per * (inter + h) + inter * h) * B)) * active + C
    bd = cm.breakdown(BatchShape([1, 1, 1], [10, 10, 10], 3))
    assert bd["mlp"] == pytest.approx(32 * (up + down))
    assert bd["moe_routing"] > 0


def test_cpu_overhead_and_sum():
    from kernels_cost_model.cost_model import CPU_BASE_S, CPU_PER_REQUEST_S, CPU_PER_TOKEN_S
    cm = make_cost_model("llama-3.1-8b", "h100", calibration=simple_calibration())
    bd = cm.breakdown(BATCH)
    assert bd["cpu"] == pytest.approx(CPU_BASE_S + 3 * CPU_PER_REQUEST_S + T * CPU_PER_TOKEN_S)
    assert sum(bd.values()) == pytest.approx(cm.step_time(BATCH))


def test_empty_batch_costs_only_cpu():
    cm = model()
    assert cm.step_time(BatchShape([], [], 0)) == 0.0
    assert cm.step_time(BatchShape([0, 0], [5, 7], 0)) == 0.0


def test_zero_token_rows_read_nothing():
    cm = model()
    assert cm.step_time(BatchShape([1, 0], [200, 9000], 1)) == cm.step_time(BatchShape([1], [200], 1))


@pytest.mark.parametrize("kwargs, field", [
    (dict(tensor_parallel_size=True), "tensor_parallel_size"), (dict(collective_scale="1"), "collective_scale"),
    (dict(collective_scale=float("inf")), "collective_scale"), (dict(cpu_per_request_s="0"), "cpu_per_request_s"),
    (dict(max_num_seqs=True), "max_num_seqs"), (dict(max_model_len=True), "max_model_len"),
    (dict(kv_cache_dtype="fp9"), "kv_cache_dtype"), (dict(calibration=5), "calibration"),
    (dict(cpu_overhead="yes"), "cpu_overhead"), (dict(enforce_eager=1), "enforce_eager"),
])
def test_make_cost_model_names_a_bad_argument(kwargs, field):
    with pytest.raises(ConfigError) as err:
        make_cost_model("llama-3.1-8b", "h100", **kwargs)
    assert err.value.field == field and err.value.value is next(iter(kwargs.values()))
