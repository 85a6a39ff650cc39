"""Measured terms of the cost model against hand computations: collectives priced by message size from
measured curves, and FlashAttention-2's per-query-head K/V reads for decode rows beside a prefill chunk."""
import pytest

from kernels_cost_model import Calibration, Coeffs, make_cost_model
from kernels_cost_model.attention_backend import decode_imbalance, imbalance_alpha, mixed_decode_s_per_byte
from kernels_cost_model.collectives import CollectiveCurve, collective_curve
from kernels_cost_model.expert_parallel import ExpertParallelCostModel
from kernels_cost_model.roofline import FAMILIES
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import ConfigError

A, B, C = 1e-15, 1e-12, 1e-6  # seconds per FLOP, per byte, per launch
US = 1e-6


def simple(gpu: str, name: str = "llama-3.1-8b", tp: int = 1):
    cal = Calibration("test", {f: Coeffs(A, B, C) for f in FAMILIES})
    return make_cost_model(name, gpu, tp, calibration=cal, cpu_overhead=False)


# ---- a curve by message size --------------------------------------------------------------------

def test_curve_interpolates_floors_and_extrapolates_by_hand():
    curve = CollectiveCurve.from_points([(4000, 20 * US), (1000, 10 * US), (2000, 12 * US)])
    assert curve.sizes == (1000.0, 2000.0, 4000.0)
    assert curve.time(10) == pytest.approx(10 * US)           # below the sweep: the smallest size's time
    assert curve.time(1000) == pytest.approx(10 * US)
    assert curve.time(1500) == pytest.approx(11 * US)         # halfway between 10 and 12 us
    assert curve.time(3000) == pytest.approx(16 * US)
    assert curve.time(6000) == pytest.approx(28 * US)         # last slope: 8 us per 2000 B


def test_curve_is_made_monotone_and_validated():
    curve = CollectiveCurve.from_points([(1000, 10 * US), (2000, 9 * US), (3000, 15 * US)])
    assert curve.seconds == (10 * US, 10 * US, 15 * US)       # a noisy faster large message is raised
    with pytest.raises(ConfigError):
        CollectiveCurve((1.0,), (1.0,))
    with pytest.raises(ConfigError):
        CollectiveCurve((2.0, 1.0), (1.0, 2.0))


def test_shipped_rtx_pro_6000_curve_matches_its_measurements_and_is_monotone():
    ar = collective_curve("rtx-pro-6000", 2, "all_reduce")
    assert ar.time(10240) == pytest.approx(12.915 * US, rel=1e-4)      # one Qwen3-32B token
    assert ar.time(1310720) == pytest.approx(47.4735 * US, rel=1e-4)   # 128 tokens
    sizes = [2.0 ** (k / 4) for k in range(40, 105)]                   # 1 KB .. 64 MB
    times = [ar.time(s) for s in sizes]
    assert all(a <= b for a, b in zip(times, times[1:]))
    busbw = [s / t for s, t in zip(sizes, times)]                      # 2 ranks: bus bytes = size
    assert busbw[0] < 1e9 and 30e9 < busbw[-1] < 40e9                  # ramps up with the size
    assert collective_curve("rtx-pro-6000", 4, "all_reduce") is None   # not measured
    assert collective_curve("h100-sxm", 2, "all_reduce") is None
    with pytest.raises(ConfigError):
        collective_curve("rtx-pro-6000", 2, "broadcast")


def test_tp2_prices_all_reduce_and_logit_gather_from_the_curves():
    cm = make_cost_model("qwen3-32b", "rtx-pro-6000", 2, calibration=None, cpu_overhead=False)
    bd = cm.breakdown(BatchShape([1] * 128, [500] * 128, 128))
    # 128 tokens x 5120 x 2 B = 1310720 B, a measured size; 64 layers x 2 + the embedding's
    assert bd["all_reduce"] == pytest.approx(129 * 47.4735 * US, rel=1e-4)
    # logits: 128 rows x 151936 / 2 x 2 B = 19447808 B, between the 16 MB and 20 MB measurements
    lo, hi = 546.2369918823242, 682.8895211219788
    gather = lo + (19447808 - 16777216) / (20971520 - 16777216) * (hi - lo)
    no_gather = make_cost_model("qwen3-32b", "rtx-pro-6000", 2, calibration=None, cpu_overhead=False)
    assert bd["lm_head"] - no_gather.lm_head.time(128, 2) == pytest.approx(gather * US, rel=1e-4)


def test_other_rank_counts_keep_latency_plus_bandwidth():
    cm = make_cost_model("qwen3-32b", "rtx-pro-6000", 4, calibration=None, cpu_overhead=False)
    bd = cm.breakdown(BatchShape([1] * 8, [100] * 8, 8))
    bus = 2 * 3 / 4 * 2 * 8 * 5120
    assert bd["all_reduce"] == pytest.approx(129 * (bus / 22.2e9 + 24.6e-6))


def test_expert_parallel_exchange_uses_all_gather_and_reduce_scatter_curves():
    base = make_cost_model("qwen3-30b-a3b", "rtx-pro-6000", calibration=None, cpu_overhead=False)
    ep = ExpertParallelCostModel(base, 2)
    terms = ep.rank_breakdown(BatchShape([1] * 64, [100] * 64, 64), 128)
    local = 128 * 2048 * 2 / 2                                         # each rank's share of T x hidden x 2 B
    per_layer = (collective_curve("rtx-pro-6000", 2, "all_gather").time(local)
                 + collective_curve("rtx-pro-6000", 2, "reduce_scatter").time(local))
    assert terms["all_to_all"] == pytest.approx(48 * per_layer)


# ---- decode rows beside a prefill chunk ------------------------------------------------------------

H, L, Q, KV, D = 4096, 32, 4096, 1024, 2   # llama-3.1-8b, TP1


def test_mixed_batch_decode_rows_read_kv_per_query_head_by_hand():
    sq, skv = mixed_decode_s_per_byte("rtx-pro-6000")
    assert (sq, skv) == pytest.approx((1 / 3.72e12, 1 / 6.29e12))
    bd = simple("rtx-pro-6000").breakdown(BatchShape([100, 1, 1], [50, 200, 300], 2))
    alpha = imbalance_alpha(decode_imbalance("rtx-pro-6000")[1], 2)   # two decodes beside a chunk
    keys = 201 + 301 + alpha * (2 * 301 - (201 + 301))                 # mean + alpha x (longest - mean)
    c_pf = 4 * 128 * 32 * (100 * 50 + 100 * 101 / 2) * A
    m_pf = D * (2 * 100 * Q + 2 * 150 * KV) * B
    c_dec = 4 * 128 * 32 * keys * A
    m_dec = max(D * (2 * 2 * Q + 2 * keys * KV) * B, D * 2 * ((2 + keys) * Q * sq + keys * KV * skv))
    total = max(c_pf + c_dec, m_pf + m_dec) + C
    assert bd["prefill_attention"] + bd["decode_attention"] == pytest.approx(L * total)


def test_mixed_term_only_beside_a_prefill_and_only_where_measured():
    decode_only = BatchShape([1] * 64, [1500] * 64, 64)
    mixed = BatchShape([512] + [1] * 63, [0] + [1500] * 63, 64)
    pro, h100 = simple("rtx-pro-6000"), simple("h100")
    assert pro.step_time(decode_only) == pytest.approx(h100.step_time(decode_only))
    assert mixed_decode_s_per_byte("h100-sxm") == (0.0, 0.0)
    attn = ("prefill_attention", "decode_attention")
    assert sum(pro.breakdown(mixed)[k] for k in attn) > 1.2 * sum(h100.breakdown(mixed)[k] for k in attn)
    # a decode row that turns into a 2-token chunk never shortens the step
    assert pro.step_time(BatchShape([2] + [1] * 63, [1499] + [1500] * 63, 64)) >= pro.step_time(decode_only)


# ---- async scheduling ---------------------------------------------------------------------------

def test_async_scheduling_hides_cpu_under_gpu_and_is_off_by_default():
    import dataclasses
    cm = make_cost_model("llama-3.1-8b", "h100", calibration=None)
    assert not cm.async_scheduling
    batch = BatchShape([1] * 32, [500] * 32, 32)
    sync = cm.breakdown(batch)
    overlapped = dataclasses.replace(cm, async_scheduling=True)
    gpu = sum(v for k, v in sync.items() if k != "cpu")
    assert sync["cpu"] > 0
    assert overlapped.step_time(batch) == pytest.approx(max(gpu, sync["cpu"]))
    assert overlapped.breakdown(batch)["cpu"] == pytest.approx(max(0.0, sync["cpu"] - gpu))
    assert overlapped.step_time(BatchShape([0], [10], 0)) == pytest.approx(cm.step_time(BatchShape([0], [10], 0)))


def test_dp_ranks_run_the_largest_ranks_graph_size_while_every_batch_fits_a_graph():
    """vLLM pads every DP rank to the largest rank's CUDA-graph size when their synced graph mode is not
    NONE (vllm/v1/worker/dp_utils.py): an idle or smaller rank pays the larger one's token-wise work, and
    the MoE exchange moves ranks x that size. A batch past the largest capture size runs eagerly: no padding."""
    base = make_cost_model("qwen3-30b-a3b", "rtx-pro-6000", calibration=None, cpu_overhead=False)
    ep = ExpertParallelCostModel(base, 2)
    big, small = BatchShape([1] * 60, [100] * 60, 60), BatchShape([1] * 5, [100] * 5, 5)
    assert ep.dp_padding([big, small]) == 64 and ep.dp_padding([small, small]) == 8
    padded = ep.rank_breakdown(small, 128, pad_to=64)
    alone = ep.rank_breakdown(small, 128)
    assert padded["qkv_proj"] == pytest.approx(ep.rank_breakdown(big, 128)["qkv_proj"])
    assert padded["qkv_proj"] > alone["qkv_proj"] and padded["decode_attention"] == alone["decode_attention"]
    assert ep.step_time([big, small]) == pytest.approx(max(
        sum(ep.rank_breakdown(x, 128, 64).values()) for x in (big, small)))   # exchange of 2 x 64 tokens
    prompt = BatchShape([4096], [0], 1)                                         # past the 512-token graphs
    assert ep.dp_padding([prompt, small]) == -1                                 # every rank eager, unpadded
    eager = ep.rank_breakdown(small, 4101, pad_to=-1)
    assert eager["qkv_proj"] < ep.rank_breakdown(small, 4101)["qkv_proj"]      # 5 tokens, not its graph's 8
    assert ep.step_time([prompt, small]) == pytest.approx(max(
        sum(ep.rank_breakdown(x, 4101, -1).values()) for x in (prompt, small)))
