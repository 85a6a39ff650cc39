"""`servesim calibrate --from-run`: the request split, subset errors, and the deployment file it writes."""
import pandas as pd
import pytest

from sim.api.simulator import SimulationConfig
from sim.fidelity.from_run import FromRunFit, deployment_toml, fit_from_run, split_requests, subset_errors
from sim.fidelity.host import HostFit
from sim.fidelity.real_runs import DEFAULT_ROOT, find_runs, read_run

RUNS = find_runs(DEFAULT_ROOT)
needs_runs = pytest.mark.skipif(not RUNS, reason="../shared/data/real_vllm_runs not present")


def _table(ids, ttft, tpot, e2e, arrivals):
    return pd.DataFrame({"request_id": ids, "arrival_s": arrivals, "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e})


def test_split_holds_out_every_fifth_request_by_arrival():
    real = _table([f"r{i}" for i in range(10)], [1.0] * 10, [0.1] * 10, [2.0] * 10, list(range(10))[::-1])
    fit, held = split_requests(real)
    assert held == {"r7", "r2"}                          # ranks 2 and 7 by arrival (arrivals run backwards)
    assert fit | held == set(real["request_id"]) and not fit & held


def test_subset_errors_use_only_the_chosen_requests():
    real = _table(["a", "b", "c"], [1.0, 2.0, 3.0], [0.1, 0.1, 0.1], [2.0, 3.0, 4.0], [0, 1, 2])
    sim = _table(["a", "b", "c"], [1.5, 2.0, 9.0], [0.1, 0.2, 0.1], [2.0, 3.0, 4.0], [0, 1, 2])
    got = subset_errors(sim, real, {"a", "b"})
    assert got["ttft_s"] == pytest.approx(3.5 / 3.0 - 1) and got["tpot_s"] == pytest.approx(0.5)
    assert got["e2e_s"] == pytest.approx(0.0)


@needs_runs
def test_deployment_file_is_a_config_servesim_run_reads_with_fitted_figures_labelled(tmp_path):
    run = read_run(next(p for p in RUNS if "Qwen3-32B" in p.name))
    fit = FromRunFit(HostFit(collective_scale=2.25, cpu_per_request_s=1.6e-5), ("cpu_per_request_s", "collective_scale"),
                     {"ttft_s": 0.01}, {"ttft_s": -0.02}, 60)
    path = tmp_path / "deployment.toml"
    path.write_text(deployment_toml(run, fit))
    cfg = SimulationConfig.from_toml(path)
    assert cfg.deployment.collective_scale == 2.25 and cfg.deployment.cpu_per_request_s == 1.6e-5
    assert cfg.deployment.tensor_parallel_size == 2 and cfg.engine.max_num_seqs == 128
    assert path.read_text().count("# FITTED end to end") == 2
    assert cfg.deployment.calibration == "rtx-pro-6000@vllm-0.19"      # kernels of the run's vLLM version
    from sim.cli.main import build_parser
    from sim.cli.run import config_from_args
    via_flag = config_from_args(build_parser().parse_args(["run", "--deployment", str(path)]))
    assert via_flag.deployment == cfg.deployment and via_flag.engine == cfg.engine


@needs_runs
def test_fit_from_run_picks_the_grid_value_closest_on_the_fit_split():
    run = read_run(next(p for p in RUNS if "Llama" in p.name))
    fit = fit_from_run(run, cpu_grid=(0.0, 6e-5))
    alone = {c: fit_from_run(run, cpu_grid=(c,)).fit_error for c in (0.0, 6e-5)}
    rms = {c: sum(e * e for e in errs.values()) for c, errs in alone.items()}
    assert fit.fitted == ("cpu_per_request_s",) and fit.host.cpu_per_request_s == min(rms, key=rms.get)
    assert abs(fit.held_out_error["tpot_s"]) < 0.05 and fit.held_out_requests == 60
