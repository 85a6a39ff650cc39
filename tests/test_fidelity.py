"""Fidelity replay: reading the real vLLM runs, and the comparison arithmetic on hand-made tables."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from kernels_cost_model import make_cost_model
from kernels_cost_model.expert_parallel import ExpertParallelCostModel, ep_kv_cache_blocks
from kernels_cost_model import kv_cache_blocks
from kernels_cost_model.batch import BatchShape
from sim.fidelity import compare
from sim.fidelity.real_runs import DEFAULT_ROOT, find_runs, measured_table, read_run, read_workload
from sim.fidelity.replay import engine_config, replay_workload

RUNS = find_runs(DEFAULT_ROOT)
needs_runs = pytest.mark.skipif(not RUNS, reason="../shared/data/real_vllm_runs not present")


# ---- comparison arithmetic on a tiny hand-made example ----------------------------------------

def _requests(ttft, tpot, outputs, arrivals, ids=None):
    ttft, tpot, outputs, arrivals = map(np.asarray, (ttft, tpot, outputs, arrivals))
    e2e = ttft + tpot * (outputs - 1)
    return pd.DataFrame({"request_id": ids or [f"r{i}" for i in range(len(ttft))], "arrival_s": arrivals,
                         "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "finish_s": arrivals + e2e,
                         "num_output_tokens": outputs})


REAL = _requests([1.0, 2.0, 3.0], [0.1, 0.1, 0.1], [11, 11, 11], [0.0, 1.0, 2.0])
SIM = _requests([1.5, 2.5, 2.0], [0.1, 0.2, 0.1], [11, 11, 11], [0.0, 1.0, 2.0])


def test_rel_error_and_aggregates_by_hand():
    assert compare.rel_error(1.1, 1.0) == pytest.approx(0.1)
    assert math.isnan(compare.rel_error(1.0, 0.0)) and math.isnan(compare.rel_error(float("nan"), 1.0))
    agg = compare.aggregate(REAL)
    assert agg["ttft_s_mean"] == pytest.approx(2.0) and agg["ttft_s_p50"] == pytest.approx(2.0)
    assert agg["ttft_s_p90"] == pytest.approx(2.8)          # numpy linear interpolation
    assert agg["e2e_s_mean"] == pytest.approx(3.0)          # ttft + 10 x 0.1
    assert agg["duration_s"] == pytest.approx(2.0 + 4.0)     # last finish 2 + 3 + 1, first arrival 0
    assert agg["request_throughput"] == pytest.approx(3 / 6.0)
    assert agg["output_token_throughput"] == pytest.approx(33 / 6.0)
    table = compare.compare_aggregates(SIM, REAL).set_index("metric")
    assert table.loc["ttft_s_mean", "sim"] == pytest.approx(2.0)
    assert table.loc["tpot_s_mean", "rel_error"] == pytest.approx((0.4 / 3 - 0.1) / 0.1)
    # sim e2e: 2.5, 4.5, 3.0 -> mean 10/3; real mean 3
    assert table.loc["e2e_s_mean", "rel_error"] == pytest.approx((10 / 3 - 3) / 3)


def test_per_request_join_and_summary():
    both = compare.per_request(SIM.iloc[::-1], REAL)     # order must not matter: joined by id
    row = both.set_index("request_id").loc["r2"]
    assert row["ttft_s_rel_error"] == pytest.approx(-1 / 3)
    summary = compare.per_request_summary(both)
    assert summary["ttft_s_median_abs_rel_error"] == pytest.approx(1 / 3)
    assert summary["tpot_s_median_abs_rel_error"] == pytest.approx(0.0)


def test_per_second_sampling_takes_the_last_step_ended():
    steps = pd.DataFrame({"end_s": [0.5, 1.0, 2.5], "num_running": [1, 2, 3], "num_waiting": [4, 5, 6]})
    s = compare.sample_per_second(steps, [0.2, 1.0, 2.0, 3.0])
    assert s["num_running"].tolist() == [0, 2, 2, 3] and s["num_waiting"].tolist() == [0, 5, 5, 6]
    err = compare.curve_error(np.array([1, 2, 3]), np.array([1, 1, 1]))
    assert err["mean_abs_diff"] == pytest.approx(1.0) and err["rel_mean_abs_diff"] == pytest.approx(1.0)


def test_measured_table_uses_queued_ts_as_arrival(tmp_path):
    rows = [{"request_id": "a", "input_toks": 5, "output_toks": 3, "arrival_time": 1e9, "queued_ts": 100.0,
             "scheduled_ts": 100.1, "first_token_ts": 100.5, "last_token_ts": 101.5},
            {"request_id": "b", "input_toks": 7, "output_toks": 1, "arrival_time": 1e9 + 1, "queued_ts": 101.0,
             "scheduled_ts": 101.0, "first_token_ts": 101.2, "last_token_ts": 101.2}]
    m = measured_table(rows).set_index("request_id")
    assert m.loc["a", "ttft_s"] == pytest.approx(0.5) and m.loc["a", "e2e_s"] == pytest.approx(1.5)
    assert m.loc["a", "tpot_s"] == pytest.approx(0.5) and math.isnan(m.loc["b", "tpot_s"])
    assert m.loc["b", "arrival_s"] == pytest.approx(1.0) and m.loc["b", "finish_s"] == pytest.approx(1.2)
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps({"input_toks": 2, "output_toks": n, "arrival_time_ns": t,
                                          "input_tok_ids": [1, 2], "output_tok_ids": [0] * n})
                              for n, t in ((4, 2_000_000_000), (6, 500_000_000))))
    specs = read_workload(path)
    assert [s.arrival_time_s for s in specs] == [0.5, 2.0] and specs[0].request_id == "bench-1"
    p = specs[0].sampling_params
    assert p.max_tokens == p.min_tokens == 6 and p.ignore_eos


# ---- expert parallelism ------------------------------------------------------------------------

def test_expert_parallel_lockstep_is_the_slowest_rank_and_frees_expert_memory():
    base = make_cost_model("qwen3-30b-a3b", "rtx-pro-6000", calibration=None)
    ep = ExpertParallelCostModel(base, 2)
    big, small = BatchShape([1] * 64, [1000] * 64, 64), BatchShape([1] * 8, [1000] * 8, 8)
    assert ep.step_time([big, small]) == pytest.approx(ep.step_time([small, big]))
    assert ep.step_time([big, small]) >= ep.step_time([small, small])
    assert ep.step_time([big, None]) > 0
    assert ep_kv_cache_blocks("qwen3-30b-a3b", "rtx-pro-6000", 2, 16, 0.9, 2048) > \
        kv_cache_blocks("qwen3-30b-a3b", "rtx-pro-6000", 1, 16, 0.9, 2048)


# ---- the real runs -----------------------------------------------------------------------------

@needs_runs
def test_real_runs_read_with_counts_and_arrivals():
    assert {p.name for p in RUNS} >= {"Llama-3.1-8B", "Qwen3-32B", "Qwen3-30B-A3B-Instruct-2507"}
    for path in RUNS:
        run = read_run(path)
        assert len(run.workload) == len(run.measured) == run.meta["num_requests"] == 300
        arrivals = np.array([s.arrival_time_s for s in run.workload])
        assert np.all(np.diff(arrivals) >= 0) and 28 < arrivals[-1] - arrivals[0] < 30.5  # 29.1 s span
        assert (run.measured["ttft_s"] > 0).all() and (run.measured["tpot_s"] > 0).all()
        by_id = run.measured.set_index("request_id")
        for spec in run.workload[:20]:  # same requests: prompt and output lengths agree
            row = by_id.loc[spec.request_id]
            assert spec.num_prompt_tokens == row["num_prompt_tokens"]
            assert spec.sampling_params.max_tokens == row["num_output_tokens"]
        sent = {s.request_id: s.arrival_time_s - arrivals[0] for s in run.workload}
        lag = np.array([s.arrival_time_s - sent[s.request_id] for s in replay_workload(run)])
        assert np.all(np.abs(lag) < 0.5) and abs(lag.mean()) < 0.2  # queued about when sent
        assert engine_config(run).max_num_seqs == 128 and engine_config(run).max_num_batched_tokens == 2048
        ticks = run.tick_times()
        assert abs(ticks[0] - 1.0) < 0.2 and len(ticks) == len(run.timeseries)


# ---- the host figures fitted end to end ----------------------------------------------------------

def test_grid_fit_picks_the_lowest_headline_error(monkeypatch):
    from sim.fidelity import fit
    from sim.fidelity.host import HostFit
    seen = []

    def fake_rms(run, host):  # a bowl with its bottom at collective_scale 2.2
        seen.append(host)
        return abs(host.collective_scale - 2.2) + (host.cpu_per_request_s or 0)

    monkeypatch.setattr(fit, "headline_rms", fake_rms)
    best, errors = fit.grid_fit(None, HostFit(cpu_per_request_s=1e-5), "collective_scale", fit.SCALE_GRID)
    assert best == pytest.approx(2.2) and len(errors) == len(fit.SCALE_GRID)
    assert all(h.cpu_per_request_s == 1e-5 for h in seen)  # the other figure stays as given
    host = fit.fit_host({fit.CPU_FIT_RUN: None, fit.COLLECTIVE_FIT_RUN: None}, report=lambda s: None)
    assert host.cpu_per_request_s == 0.0 and host.collective_scale == pytest.approx(2.2)


def test_host_figures_reach_the_cost_model():
    from sim.api.cost_setup import build_cost_model
    from sim.api.sections import DeploymentConfig
    from kernels_cost_model.errors import ConfigError
    d = DeploymentConfig(model="qwen3-32b", gpu="rtx-pro-6000", tensor_parallel_size=2,
                         cpu_gpu_overlap=False)  # the whole CPU time shows
    base = build_cost_model(d)
    slow = build_cost_model(DeploymentConfig(model="qwen3-32b", gpu="rtx-pro-6000", tensor_parallel_size=2,
                                             collective_scale=2.0, cpu_per_request_s=2e-5, cpu_gpu_overlap=False))
    batch = BatchShape([1] * 64, [500] * 64, 64)
    b0, b1 = base.breakdown(batch), slow.breakdown(batch)
    assert b1["all_reduce"] == pytest.approx(2 * b0["all_reduce"])
    from kernels_cost_model.cost_model import CPU_PER_REQUEST_S
    assert b1["cpu"] - b0["cpu"] == pytest.approx(64 * (2e-5 - CPU_PER_REQUEST_S))
    assert b1["mlp"] == b0["mlp"]
    for bad in ({"collective_scale": 0}, {"collective_scale": float("nan")}, {"cpu_per_request_s": -1e-6},
                {"cpu_gpu_overlap": "yes"}):
        with pytest.raises(ConfigError, match="deployment"):
            DeploymentConfig(**bad)


@needs_runs
@pytest.mark.xfail(reason="with nothing fitted end to end the two-GPU replays run too fast: Llama TP1 -2/-0/-1/-2 %, "
                          "Qwen3-32B TP2 -29/-19/-23/-18 %, MoE DP2 -49/-9/-10/-9 % (TTFT/TPOT/E2E/duration; "
                          "docs/fidelity.md; docs/cost_model.md: Qwen3 prefill attention was priced 9x its "
                          "measured kernels before)", strict=False)
def test_replay_with_nothing_fitted_meets_the_goal_on_every_run():
    from sim.fidelity.host import UNFITTED
    from sim.fidelity.report import HEADLINE, compare_run
    for path in RUNS:
        agg = compare_run(read_run(path), host=UNFITTED).aggregates.set_index("metric")["rel_error"]
        assert all(abs(agg[m]) < 0.10 for m in HEADLINE), (path.name, agg[list(HEADLINE)].to_dict())


# ---- leave one GPU out: the runs' GPU with datasheet figures only --------------------------------

def test_left_out_calibration_derives_from_the_other_gpus_only():
    from kernels_cost_model.calibration import shipped_calibration
    from kernels_cost_model.gpu_calibration import SOURCES, left_out_calibration
    cal = left_out_calibration("rtx-pro-6000")
    voters = set(cal.provenance["derived_from"])
    assert "rtx-pro-6000" not in voters and not any("@" in d for d in voters)
    assert voters == {d for d in SOURCES if "@" not in d} - {"rtx-pro-6000"}
    for name in ("rtx-pro-6000", "rtx-pro-6000@vllm-0.19"):  # neither shipped fit leaks in
        shipped = shipped_calibration(name)
        assert all(cal.coeffs[f] != shipped.coeffs[f] for f in ("matmul", "decode_attention", "all_reduce"))
    with_it = left_out_calibration("h100-sxm")  # another GPU left out: the RTX PRO 6000 now votes
    assert "rtx-pro-6000" in with_it.provenance["derived_from"]


@pytest.fixture(scope="module")
def leave_out_runs():
    from sim.fidelity.replay import leave_gpu_out_cost_model
    return {p.name: (read_run(p), leave_gpu_out_cost_model(read_run(p))) for p in RUNS}


@needs_runs
def test_leave_gpu_out_cost_model_carries_no_measurement_of_the_gpu(leave_out_runs):
    from kernels_cost_model.attention_backend import decode_imbalance
    from sim.fidelity.replay import simulation_config
    from sim.api.cost_setup import build_cost_model
    for run, cm in leave_out_runs.values():
        assert cm.calibration.device == "rtx-pro-6000@uncalibrated"
        assert cm.calibration.provenance["kind"] == "leave one GPU out"
        assert "rtx-pro-6000" not in cm.calibration.provenance["derived_from"]
        sources = dict(cm.mechanism_sources)                                  # derived, never its own rows
        assert "rtx-pro-6000" not in sources["mixed_decode"] + sources["decode_imbalance"]
        assert cm.decode_imbalance != decode_imbalance("rtx-pro-6000")
        assert cm.all_reduce_curve is None and cm.all_gather_curve is None     # its collective sweep
        assert cm.gpu.hbm_bytes_per_s == 1792e9 and cm.gpu.bf16_flops_per_s == 500e12  # datasheet
        shipped = build_cost_model(simulation_config(run).deployment, engine_config(run))
        batch = BatchShape([1] * 64, [800] * 64, 64)
        assert cm.step_time(batch) != pytest.approx(shipped.step_time(batch), rel=1e-3)


@needs_runs
def test_leave_gpu_out_replay_gives_finite_figures(leave_out_runs):
    from sim.fidelity.report import HEADLINE, compare_run
    for name, (run, cm) in leave_out_runs.items():
        agg = compare_run(run, cost_model=cm).aggregates.set_index("metric")["rel_error"]
        assert all(np.isfinite(agg[m]) for m in HEADLINE), (name, agg[list(HEADLINE)].to_dict())
        if name == "Llama-3.1-8B":  # +10.5 / +4.9 / +6.3 / +5.4 % (docs/fidelity.md): inside the 20 % goal
            assert all(abs(agg[m]) < 0.15 for m in HEADLINE), agg[list(HEADLINE)].to_dict()
