"""Summary metrics of a tiny run against numbers worked out by hand from LinearCostModel."""
import math

import numpy as np
import pytest

from sim import SamplingParams, SimulationConfig, simulate
from sim.core.cost import LinearCostModel
from workloads import RequestSpec

CM = LinearCostModel()
BLOCKS = 1024


def step_s(new: int, context_before: int, sampled: int = 1) -> float:
    """LinearCostModel's documented formula, written out independently."""
    return CM.fixed_s + CM.per_new_token_s * new + CM.per_context_token_s * (context_before + new) \
        + CM.per_sampled_s * sampled


def tiny_run(**slo):
    """req A: 100-token prompt, 4 outputs at t=0; req B: 50-token prompt, 2 outputs at t=1 (idle engine)."""
    config = SimulationConfig().replace(
        deployment={"cost_model": "linear"}, slo=slo,
        engine={"num_gpu_blocks": BLOCKS, "max_model_len": 2048, "max_num_batched_tokens": 2048})
    specs = [RequestSpec(0.0, np.arange(100), sampling_params=SamplingParams(max_tokens=4, ignore_eos=True)),
             RequestSpec(1.0, np.arange(1000, 1050),
                         sampling_params=SamplingParams(max_tokens=2, ignore_eos=True))]
    return simulate(config, workload=specs)


# Hand-derived step times: A prefills 100 tokens (first token), then 3 decode steps at context 100..102.
A_STEPS = [step_s(100, 0), step_s(1, 100), step_s(1, 101), step_s(1, 102)]
B_STEPS = [step_s(50, 0), step_s(1, 50)]
A_TTFT, B_TTFT = A_STEPS[0], B_STEPS[0]
A_E2E, B_E2E = sum(A_STEPS), sum(B_STEPS)
A_TPOT, B_TPOT = (A_E2E - A_TTFT) / 3, (B_E2E - B_TTFT) / 1
SPAN = 1.0 + B_E2E          # first arrival (0) to last finish


def test_latencies_by_hand():
    s = tiny_run().summary
    assert s["mean_ttft_ms"] == pytest.approx(1e3 * (A_TTFT + B_TTFT) / 2)
    assert s["median_ttft_ms"] == pytest.approx(1e3 * (A_TTFT + B_TTFT) / 2)
    assert s["mean_tpot_ms"] == pytest.approx(1e3 * (A_TPOT + B_TPOT) / 2)   # first token excluded
    assert s["mean_e2el_ms"] == pytest.approx(1e3 * (A_E2E + B_E2E) / 2)
    assert s["mean_queueing_ms"] == pytest.approx(0.0)
    itl = A_STEPS[1:] + B_STEPS[1:]
    assert s["mean_itl_ms"] == pytest.approx(1e3 * np.mean(itl))


def test_throughput_by_hand():
    s = tiny_run().summary
    assert s["duration"] == pytest.approx(SPAN)
    assert s["request_throughput"] == pytest.approx(2 / SPAN)
    assert s["output_throughput"] == pytest.approx(6 / SPAN)
    assert s["total_token_throughput"] == pytest.approx((6 + 150) / SPAN)
    assert (s["num_requests"], s["completed"], s["num_preemptions"]) == (2, 2, 0)


def test_goodput_and_attainment_by_hand():
    # TTFT SLO between B's and A's TTFT: only B meets it.
    s = tiny_run(ttft_s=(A_TTFT + B_TTFT) / 2).summary
    assert s["slo_attainment"] == pytest.approx(0.5)
    assert s["request_goodput"] == pytest.approx(1 / SPAN)
    # TPOT SLO both meet; E2E SLO neither meets.
    assert tiny_run(tpot_s=max(A_TPOT, B_TPOT) * 1.01).summary["slo_attainment"] == 1.0
    assert tiny_run(e2e_s=min(A_E2E, B_E2E) / 2).summary["request_goodput"] == 0.0


def test_with_slo_matches_config_slo():
    a = tiny_run(ttft_s=A_TTFT * 0.99).summary
    b = tiny_run().with_slo(ttft_s=A_TTFT * 0.99).summary
    assert a == pytest.approx(b, nan_ok=True)


def test_kv_occupancy_by_hand():
    # A holds ceil(100/16) = 7 blocks after its first three steps and frees them at the end of the
    # fourth; B holds ceil(50/16) = 4 blocks after its first step. Mean is weighted by step time.
    s = tiny_run().summary
    used = [7, 7, 7, 0, 4, 0]
    dur = A_STEPS + B_STEPS
    assert s["kv_occupancy_peak"] == pytest.approx(7 / BLOCKS)
    assert s["kv_occupancy_mean"] == pytest.approx(np.dot(used, dur) / sum(dur) / BLOCKS)
    assert s["kv_time_above_90pct"] == 0.0


def test_one_token_request_has_no_tpot():
    config = SimulationConfig().replace(deployment={"cost_model": "linear"}, engine={"num_gpu_blocks": 600})
    spec = RequestSpec(0.0, np.arange(10), sampling_params=SamplingParams(max_tokens=1, ignore_eos=True))
    r = simulate(config, workload=[spec])
    assert math.isnan(r.summary["mean_tpot_ms"]) and math.isnan(r.summary["mean_itl_ms"])
    assert r.summary["mean_ttft_ms"] == pytest.approx(1e3 * step_s(10, 0))
    assert r.summary["slo_attainment"] == 1.0
