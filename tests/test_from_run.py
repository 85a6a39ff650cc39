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


# ----- a `vllm bench serve --save-detailed` result as the measured run ------------------------------------
def _bench_file(tmp_path, cpu_per_request_s=2e-5, num_gpu_blocks=None, **change):
    """A detailed result file of a known host: servesim's own run written in vllm bench serve's schema."""
    import json
    from sim.api.bench_result import bench_serve_result
    from sim.api.sections import DeploymentConfig, WorkloadConfig
    from sim.api.simulator import simulate
    from sim.core.config import EngineConfig
    cfg = SimulationConfig(engine=EngineConfig(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=8192,
                                               num_gpu_blocks=num_gpu_blocks),
                           deployment=DeploymentConfig(model="llama-3.1-8b", gpu="h100", cpu_gpu_overlap=False,
                                                       cpu_per_request_s=cpu_per_request_s),
                           workload=WorkloadConfig(rate=12.0, num_requests=100, lengths="sharegpt", max_tokens=600),
                           seed=3)
    doc = {**bench_serve_result(simulate(cfg), detailed=True), **change}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    return path, doc


ENGINE = {"model": "llama-3.1-8b", "tensor_parallel_size": 1, "max_num_seqs": 64, "max_num_batched_tokens": 2048,
          "max_model_len": 8192}


def test_a_bench_serve_result_recovers_the_host_it_was_made_with(tmp_path):
    from sim.fidelity.bench_serve import read_bench_serve
    path, doc = _bench_file(tmp_path)
    run = read_bench_serve(path, ENGINE, "h100")
    assert len(run.workload) == len(doc["input_lens"]) == 100 and run.gpu == "h100"
    assert list(run.measured["ttft_s"]) == pytest.approx(doc["ttfts"])
    assert list(run.measured["e2e_s"]) == pytest.approx(doc["latencies"])
    fit = fit_from_run(run, cpu_grid=(1e-5, 2e-5, 3e-5))
    assert fit.host.cpu_per_request_s == 2e-5 and fit.fitted == ("cpu_per_request_s",)
    assert max(abs(e) for e in fit.held_out_error.values()) < 0.01
    # without end-to-end times, E2E is TTFT plus the streamed gaps: the same figures
    gaps = read_bench_serve(_bench_file(tmp_path, latencies=None)[0], ENGINE, "h100")
    assert list(gaps.measured["e2e_s"]) == pytest.approx(doc["latencies"])


def test_calibrate_from_a_bench_serve_result_writes_a_deployment_for_that_gpu(tmp_path, capsys):
    from sim.cli.main import build_parser
    path, _ = _bench_file(tmp_path)
    out = tmp_path / "deployment.toml"
    args = build_parser().parse_args(["calibrate", "--from-run", str(path), "--model", "llama-3.1-8b", "--gpu", "h100",
                                      "--max-num-seqs", "64", "--max-num-batched-tokens", "2048",
                                      "--max-model-len", "8192", "--out", str(out)])
    assert args.func(args) == 0
    cfg = SimulationConfig.from_toml(out)
    assert cfg.deployment.gpu == "h100" and cfg.deployment.cpu_per_request_s == 2e-5
    assert cfg.engine.max_num_seqs == 64 and cfg.engine.enable_prefix_caching
    assert "cpu_per_request_s = 2e-05" in capsys.readouterr().out


@pytest.mark.parametrize("change, message", [
    ({"start_times": None}, r"result.json:start_times=None: missing"),
    ({"ttfts": [None] * 100}, r"ttfts=None: no request completed"),
    ({"output_lens": [1] * 99}, r"output_lens=99: must list every request \(100\)"),
    ({"input_lens": [-1] * 100}, r"input_lens\[0\]=-1: must be a number >= 0"),
    ({"latencies": None, "itls": None}, r"itls=None: missing, and no latencies or e2els either"),
    ({"latencies": [-1.0] * 100}, r"latencies\[0\]=-1.0: must be a number >= the request's TTFT"),
    ({"latencies": None, "itls": [[0.1, -2.0]] * 100}, r"itls\[0\]=\[0.1, -2.0\]: must be a list of gaps"),
])
def test_a_malformed_bench_serve_result_is_named(tmp_path, change, message):
    from kernels_cost_model.errors import ConfigError
    from sim.fidelity.bench_serve import read_bench_serve
    path, _ = _bench_file(tmp_path, **change)
    with pytest.raises(ConfigError, match=message):
        read_bench_serve(path, ENGINE, "h100")


def test_a_kv_cache_size_the_run_recorded_is_what_the_replay_holds(tmp_path, capsys):
    from sim.cli.main import build_parser
    from sim.fidelity.bench_serve import read_bench_serve
    from sim.fidelity.replay import replay
    path, _ = _bench_file(tmp_path, num_gpu_blocks=900)   # small: preemptions
    run = read_bench_serve(path, {**ENGINE, "num_gpu_blocks": 900}, "h100")
    assert replay(run).num_gpu_blocks == 900
    sized = read_bench_serve(path, ENGINE, "h100")
    assert replay(sized).num_gpu_blocks > 10_000                        # servesim's own sizing of an H100
    assert fit_from_run(run, cpu_grid=(1e-5, 2e-5, 3e-5)).host.cpu_per_request_s == 2e-5
    out = tmp_path / "deployment.toml"
    args = build_parser().parse_args(["calibrate", "--from-run", str(path), "--model", "llama-3.1-8b", "--gpu", "h100",
                                      "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--max-model-len",
                                      "8192", "--num-gpu-blocks", "900", "--out", str(out)])
    assert args.func(args) == 0
    assert SimulationConfig.from_toml(out).engine.num_gpu_blocks == 900
    assert "KV cache: 900 blocks as the run recorded (servesim would size" in capsys.readouterr().out


def test_a_fit_at_the_top_of_its_grid_says_so(tmp_path):
    from sim.fidelity.bench_serve import read_bench_serve
    run = read_bench_serve(_bench_file(tmp_path)[0], ENGINE, "h100")   # made with 20 us per request
    with pytest.warns(UserWarning, match=r"cpu_per_request_s = 1e-05 is the top of its grid"):
        fit = fit_from_run(run, cpu_grid=(0.0, 1e-5))
    assert fit.host.cpu_per_request_s == 1e-5


def test_failed_requests_are_left_out_with_a_warning(tmp_path):
    from sim.fidelity.bench_serve import read_bench_serve
    path, doc = _bench_file(tmp_path, errors=["timeout"] * 3 + [""] * 97)
    with pytest.warns(UserWarning, match="3 of 100 requests failed"):
        run = read_bench_serve(path, ENGINE, "h100")
    assert len(run.workload) == len(run.measured) == 97 and "bench-0" not in set(run.measured["request_id"])


def test_calibrate_from_run_names_missing_engine_arguments_and_bad_run_folders(tmp_path):
    import json
    from kernels_cost_model.errors import ConfigError
    from sim.cli.calibrate import measured_run
    from sim.cli.main import build_parser
    path, _ = _bench_file(tmp_path)
    args = build_parser().parse_args(["calibrate", "--from-run", str(path), "--gpu", "h100"])
    with pytest.raises(ConfigError, match="--model='': required with a vllm bench serve result"):
        measured_run(args)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps({"engine_kwargs": {"model": "llama-3.1-8b"}}))
    with pytest.raises(ConfigError, match=r"engine_kwargs=\['tensor_parallel_size'\]"):
        read_run(folder)
    (folder / "meta.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        read_run(folder)


@pytest.mark.parametrize("reader, field", [
    ("workloads.traces:read_trace", "path"), ("workloads.lengths:read_length_columns", "path"),
    ("kernels_cost_model.calibration:load_calibration", "calibration"),
    ("kernels_cost_model.profile_schema:read_profile", "profile"),
    ("sim.fidelity.real_runs:read_run", "run_dir"), ("sim.fidelity.real_runs:read_workload", "workload")])
@pytest.mark.parametrize("value", [None, 5, ["a.csv"]])
def test_file_readers_name_an_argument_that_is_not_a_path(reader, field, value):
    import importlib
    from kernels_cost_model.errors import ConfigError
    module, name = reader.split(":")
    with pytest.raises(ConfigError, match=rf"^{field}=.*: must be a path to"):
        getattr(importlib.import_module(module), name)(value)


def _own_run(tmp_path, **meta_change):
    """A run folder of one's own: its GPU, engine settings and workload file in it."""
    import json
    folder = tmp_path / "my-run"
    folder.mkdir()
    meta = {"model": "llama-3.1-8b", "gpu": "h100", "vllm_version": "0.19.0", "dataset_path": "workload.jsonl",
            "engine_kwargs": {"model": "llama-3.1-8b", "tensor_parallel_size": 1, "max_num_seqs": 32,
                              "max_num_batched_tokens": 4096, "block_size": 32, "enable_prefix_caching": False,
                              "kv_cache_dtype": "fp8"}, **meta_change}
    (folder / "meta.json").write_text(json.dumps(meta))
    rows = [{"input_toks": 100 + i, "output_toks": 20, "arrival_time_ns": i * 10**8,
             "input_tok_ids": list(range(5, 105 + i)), "output_tok_ids": [7] * 20} for i in range(5)]
    (folder / "workload.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "requests.jsonl").write_text("".join(json.dumps(
        {"request_id": f"bench-{i}", "input_toks": 100 + i, "output_toks": 20, "arrival_time": 1e9 + 0.1 * i,
         "queued_ts": 50.0 + 0.1 * i, "scheduled_ts": 50.0 + 0.1 * i, "first_token_ts": 50.05 + 0.1 * i,
         "last_token_ts": 50.5 + 0.1 * i}) + "\n" for i in range(5)))
    (folder / "timeseries.csv").write_text("t,running,waiting\n0,1,0\n")
    return folder


def test_a_run_folder_of_ones_own_is_replayed_on_its_gpu_with_its_settings(tmp_path):
    from kernels_cost_model.errors import ConfigError
    from sim.fidelity.replay import replay, simulation_config
    run = read_run(_own_run(tmp_path))
    cfg = simulation_config(run)
    assert run.gpu == "h100" and cfg.deployment.gpu == "h100" and cfg.deployment.kv_cache_dtype == "fp8"
    assert cfg.engine.block_size == 32 and not cfg.engine.enable_prefix_caching
    assert cfg.deployment.calibration == "default"  # no h100 calibration measured under vLLM 0.19
    assert len(replay(run).requests) == 5 and replay(run).num_gpu_blocks > 10_000  # sized: nothing recorded
    (run.path / "server.log").write_text("INFO GPU KV cache size: 320,000 tokens\n")   # vLLM's start-up line
    assert replay(read_run(run.path)).num_gpu_blocks == 320_000 // 32
    (tmp_path / "b").mkdir()
    with pytest.raises(ConfigError, match=r"dataset_path='nowhere.jsonl': no workload file found"):
        read_run(_own_run(tmp_path / "b", dataset_path="nowhere.jsonl"))


@pytest.mark.parametrize("gpu,extra,budget,seqs", [
    ("h100", {}, 8192, 1024),                                  # vllm serve on an H100
    ("l40s", {}, 2048, 256),                                   # ... on a 48 GB GPU
    ("h100", {"usage_context": "engine_context"}, 2048, 128),  # an engine built directly
    ("h100", {"max_num_seqs": 64}, 8192, 64),                  # a set one is kept
])
def test_a_run_that_left_the_batch_settings_unset_replays_vllms_defaults(tmp_path, gpu, extra, budget, seqs):
    from sim.fidelity.replay import engine_config, simulation_config
    kwargs = {"model": "llama-3.1-8b", "tensor_parallel_size": 1, "max_num_seqs": None,
              "max_num_batched_tokens": None, **extra}
    run = read_run(_own_run(tmp_path, gpu=gpu, engine_kwargs=kwargs))
    assert (engine_config(run).max_num_batched_tokens, engine_config(run).max_num_seqs) == (budget, seqs)
    engine = simulation_config(run).engine
    assert (engine.max_num_batched_tokens, engine.max_num_seqs) == (budget, seqs)


@pytest.mark.parametrize("file, content, named", [
    ("meta.json", b"\x89PNG\x00\xff", r"my-run/meta.json='byte 0': not UTF-8 text"),
    ("requests.jsonl", b'{"request_id": "x"}\n{oops\n', r"my-run/requests.jsonl='line 2': not JSON"),
    ("requests.jsonl", b"5\n", r"my-run/requests.jsonl='line 1': must be a JSON object"),
    ("workload.jsonl", b'{"x": 1}\n', r"my-run/workload.jsonl='line 1': lacks \['output_toks', "),
])
def test_a_broken_file_of_a_run_folder_is_named_by_file_and_line(tmp_path, file, content, named):
    """Each was a raw UnicodeDecodeError, JSONDecodeError or KeyError (exit code 1 from servesim calibrate)."""
    from kernels_cost_model.errors import ConfigError
    folder = _own_run(tmp_path)
    (folder / file).write_bytes(content)
    with pytest.raises(ConfigError, match=named):
        read_run(folder)


def test_calibrate_from_a_folder_without_meta_json_names_the_flag(tmp_path, capsys):
    """It said "meta.json: file not found", naming neither the folder nor what a run folder holds."""
    from sim.cli import main
    assert main(["calibrate", "--from-run", str(tmp_path), "--out", str(tmp_path / "d.toml")]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --from-run='{tmp_path}': a folder without meta.json: not a "
                                       "run folder in the shared runs' format (meta.json, requests.jsonl, "
                                       "timeseries.csv)\n")


@pytest.mark.parametrize("flag, name, content, named", [
    ("--calibration", "cal.json", b"\x89PNG\x00", "unreadable calibration file: not a text file (byte 0 is not UTF-8)"),
    ("--calibration", "cal.json", b'{"device": "x", "coeffs": []}', 'needs a "device" name and a "coeffs" table'),
    ("--calibration", "cal.json", b"[1]", 'needs a "device" name and a "coeffs" table'),
    ("--gpu", "gpu.json", b"\x89PNG\x00", "cannot read the GPU spec file: not a text file (byte 0 is not UTF-8)"),
    ("--model", "config.json", b"\x89PNG\x00", "cannot read config.json: not a text file (byte 0 is not UTF-8)"),
])
def test_a_json_file_a_flag_names_that_is_binary_or_malformed_is_a_named_error(tmp_path, capsys, flag, name,
                                                                               content, named):
    """A binary GPU spec file, model config.json or calibration file, or a calibration whose coeffs are a
    list, ended servesim run with a traceback (exit code 1)."""
    from sim.cli import main
    path = tmp_path / name
    path.write_bytes(content)
    assert main(["run", flag, str(path), "--num-prompts", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim: error: deployment.") and named in err and err.count("\n") == 1
