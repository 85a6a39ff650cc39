"""The servesim CLI: exit codes, one-line error messages, outputs, --help."""
import json
from pathlib import Path

import pytest

from sim.cli.main import COMMANDS, build_parser, main

FAST = ["--num-requests", "20", "--rate", "20"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_prints_summary_table(capsys):
    code, out, err = run_cli(capsys, "run", *FAST, "--slo-ttft", "500ms", "--slo-tpot", "0.05")
    assert code == 0
    assert "TTFT (ms)" in out and "TPOT (excl. 1st token)" in out and "Goodput" in out
    assert "TTFT <= 500 ms" in out and "Traceback" not in err


def test_run_json_and_seed(capsys):
    code, out, _ = run_cli(capsys, "run", *FAST, "--json", "--seed", "4")
    summary = json.loads(out)
    assert code == 0 and summary["num_requests"] == 20
    assert json.loads(run_cli(capsys, "run", *FAST, "--json", "--seed", "4")[1]) == summary


def test_run_out_writes_tables_summary_and_plots(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", *FAST, "--out", str(tmp_path), "--format", "csv")
    assert code == 0 and "wrote" in err
    names = {p.name for p in tmp_path.iterdir()}
    assert {"requests.csv", "steps.csv", "tokens.csv", "summary.json", "summary.txt", "plots"} <= names
    assert {p.suffix for p in (tmp_path / "plots").iterdir()} == {".png"}
    code, out, _ = run_cli(capsys, "plot", str(tmp_path), "--format", "svg", "--out", str(tmp_path / "svg"))
    assert code == 0 and len(list((tmp_path / "svg").glob("*.svg"))) == 5


@pytest.mark.parametrize("argv, message", [
    (["--rate", "-1"], "servesim: error: workload.rate=-1.0: must be > 0"),
    (["--tp", "0"], "servesim: error: deployment.tensor_parallel_size=0: must be an integer >= 1"),
    (["--model", "gpt-17"], "servesim: error: deployment.model='gpt-17': unknown model"),
    # (an unknown model leaves the unchunked step budget, its max_model_len, unresolved; with PP or a
    # CPU tier the model, not their flags, is named)
    (["--model", "gpt-17", "--no-chunked-prefill"], "servesim: error: deployment.model='gpt-17': unknown model"),
    (["--model", "gpt-17", "--pipeline-parallel-size", "2"],
     "servesim: error: deployment.model='gpt-17': unknown model"),
    (["--model", "gpt-17", "--kv-offloading-size", "8"], "servesim: error: deployment.model='gpt-17': unknown model"),
    (["--gpu", "tpu-v9"], "servesim: error: deployment.gpu='tpu-v9': unknown GPU"),
    (["--policy", "nope"], "servesim: error: engine.policy='nope': unknown"),
    (["--num-gpu-blocks", "3"], "servesim: error: engine.num_gpu_blocks=3:"),
    (["--trace", "/no/such/trace.csv"], "servesim: error: workload.rate=20.0: not used by kind = 'trace'"),
    (["--config", "/no/such.toml"], "servesim: error: config='/no/such.toml': file not found"),
    (["--lengths", "nope"], "servesim: error: workload.lengths='nope': unknown preset"),
    (["--no-chunked-prefill", "--max-num-batched-tokens", "100"],
     "servesim: error: engine.max_num_batched_tokens=100: must be >= max_model_len=131072"),
    (["--workload", "closed_loop"], "servesim: error: workload.num_users=None: closed_loop needs num_users"),
    (["--burstiness", "1e-9"], "servesim: error: --burstiness=1e-09: must be in [1e-06, 1e+06]"),
    (["--workload", "gamma", "--cv", "1e-300"], "servesim: error: workload.cv=1e-300: must be in [0.001, 1000.0]"),
    (["--max-num-batched-tokens", "10", "--max-num-seqs", "256"],
     "servesim: error: engine.max_num_batched_tokens=10: must be >= max_num_seqs=256"),
    # each named another field, or none, before
    (["--workload", "closed_loop", "--num-users", "3", "--burstiness", "2"],
     "servesim: error: --burstiness=2.0: shapes open-loop arrivals (poisson or gamma); the workload is 'closed_loop'"),
    (["--policy", "orca"], "servesim: error: engine.max_num_batched_tokens=8192: must be >= max_model_len=131072"),
    (["--speculative-config", '{"method": "draft_model", "model": "nope", "num_speculative_tokens": 3}'],
     "servesim: error: speculative_config.model='nope': unknown model"),
    (["--pipeline-link", "nope"], "servesim: error: --pipeline-link='nope': unknown link"),
    (["--model", "qwen2.5-0.5b", "--gpu", "mi300x", "--block-size", "1", "-pp", "2"],
     "servesim: error: engine.block_size=1: qwen2.5-0.5b on mi300x leaves room for 29023138 KV blocks"),
])
def test_config_errors_exit_2_with_one_line(capsys, argv, message):
    code, out, err = run_cli(capsys, "run", *FAST, *argv)
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_a_folder_given_as_trace_is_named_as_one(capsys):
    code, _, err = run_cli(capsys, "run", "--trace", "/")
    assert code == 2 and err == "servesim: error: workload.path='/': is a folder, not a trace file\n"


@pytest.mark.parametrize("toml, message", [
    ("[workload]\nrate = 0\n", "workload.rate=0: must be > 0"),
    ("[engine]\nmax_num_seqs = 0\n", "engine.max_num_seqs=0: must be an integer >= 1"),
    ("[engine]\nmax_num_seqs = \"many\"\n", "engine.max_num_seqs='many': must be an integer"),
    ("[workload]\nspeed = 3\n", "workload.speed=3: unknown setting"),
    ("[gpus]\nn = 1\n", "gpus={'n': 1}: unknown section"),
    ("[engine\n", "not valid TOML"),
])
def test_bad_config_files_exit_2(capsys, tmp_path, toml, message):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    code, _, err = run_cli(capsys, "run", "--config", str(path))
    assert code == 2 and err.startswith("servesim: error: ") and message in err
    assert err.count("\n") == 1


def test_good_config_file_and_flag_override(capsys, tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('seed = 2\n[workload]\nrate = 30.0\nnum_requests = 15\n[slo]\nttft_s = 0.3\n')
    code, out, _ = run_cli(capsys, "run", "--config", str(path), "--num-requests", "10", "--json")
    assert code == 0 and json.loads(out)["num_requests"] == 10


@pytest.mark.parametrize("argv", [["run", "--rate", "fast"], ["bogus"], [], ["run", "--slo-ttft", "5 min"]])
def test_usage_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_plot_of_missing_folder_exits_2(capsys, tmp_path):
    code, _, err = run_cli(capsys, "plot", str(tmp_path))
    assert code == 2 and "summary.json" in err


def test_plot_and_report_of_a_disagg_or_incomplete_folder_say_what_is_wrong(capsys, tmp_path):
    import json
    (tmp_path / "summary.json").write_text(json.dumps({"summary": {}, "meta": {"ratio": "1P:1D"}}))
    for command in ("plot", "report"):
        code, _, err = run_cli(capsys, command, str(tmp_path))
        assert code == 2 and "a servesim disagg folder" in err
    (tmp_path / "summary.json").write_text(json.dumps({"format": "csv", "summary": {}, "meta": {}}))
    code, _, err = run_cli(capsys, "plot", str(tmp_path))
    assert code == 2 and err.strip() == f"servesim: error: {tmp_path / 'requests.csv'}: file not found"


def test_unexpected_failure_exits_1(capsys, monkeypatch):
    import sim.api.simulator
    monkeypatch.setattr(sim.api.simulator, "run_engine", lambda *a, **k: 1 / 0)
    code, _, err = run_cli(capsys, "run", *FAST)
    assert code == 1 and "servesim: unexpected error: ZeroDivisionError" in err


def test_help_documents_commands_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    for word in ("run", "plot", "calibrate", "exit codes", "servesim: error: <field>=<value>: <reason>"):
        assert word in out


def test_registry_is_a_list_of_add_parser_functions():
    names = set(build_parser()._subparsers._group_actions[0].choices)
    assert {"run", "plot", "calibrate"} <= names and len(COMMANDS) == len(names)


def test_progress_line_goes_to_stderr(capsys):
    code, out, err = run_cli(capsys, "run", *FAST, "--progress")
    assert code == 0 and "requests done" not in out


def test_readme_starts_with_the_two_fresh_machine_commands():
    from pathlib import Path
    lines = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    assert lines[2:6] == ["```bash",
                          "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && servesim run",
                          'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && pytest',
                          "```"]


def test_without_pyarrow_out_falls_back_to_csv_and_parquet_is_a_config_error(capsys, tmp_path, monkeypatch):
    import sim.api.results
    monkeypatch.setattr(sim.api.results, "parquet_available", lambda: False)
    code, _, _ = run_cli(capsys, "run", *FAST, "--out", str(tmp_path / "a"), "--plot-format", "none")
    assert code == 0 and (tmp_path / "a" / "requests.csv").exists()
    code, _, err = run_cli(capsys, "run", *FAST, "--out", str(tmp_path / "b"), "--format", "parquet")
    assert code == 2 and err.startswith("servesim: error: format='parquet': Parquet needs pyarrow")


def test_deployment_file_and_calibration_flag(capsys, tmp_path):
    from sim.cli.run import config_from_args
    path = tmp_path / "host.toml"
    path.write_text('[deployment]\ngpu = "rtx-pro-6000"\ncpu_per_request_s = 1e-5\n'
                    'calibration = "rtx-pro-6000@vllm-0.19"\n[engine]\nmax_num_seqs = 64\n')
    args = build_parser().parse_args(["run", "--deployment", str(path), "--max-num-seqs", "32"])
    config = config_from_args(args)
    d = config.deployment
    assert (d.gpu, d.cpu_per_request_s, d.calibration) == ("rtx-pro-6000", 1e-5, "rtx-pro-6000@vllm-0.19")
    assert config.engine.max_num_seqs == 32                         # a flag still wins over the file
    code, out, _ = run_cli(capsys, "run", *FAST, "--deployment", str(path), "--json")
    assert code == 0 and json.loads(out)["num_requests"] == 20


@pytest.mark.parametrize("toml, message", [
    ('[workload]\nrate = 3.0\n', "--deployment="),
    ('[deployment]\nspeed = 3\n', "deployment.speed=3: unknown setting"),
    ('[deployment]\ncollective_scale = 1e300\n', "deployment.collective_scale=1e+300: must be in (0, 100]"),
    ('[deployment]\ngpu = "h100"\ncalibration = "rtx-pro-6000@vllm-0.19"\n', "not of h100"),
])
def test_bad_deployment_files_exit_2_with_one_line(capsys, tmp_path, toml, message):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    code, _, err = run_cli(capsys, "run", *FAST, "--deployment", str(path))
    assert code == 2 and message in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "run", *FAST, "--deployment", str(tmp_path / "none.toml"))
    assert code == 2 and "--deployment=" in err and "file not found" in err


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    assert main(["run", *FAST, "--out", str(folder), "--format", "csv", "--plot-format", "none",
                 "--no-progress"]) == 0
    return folder


@pytest.mark.parametrize("name, content, message", [
    ("summary.json", "{bad", "not valid JSON (line 1, column 2); not a servesim summary"),
    ("summary.json", "[]", "not a servesim summary (an object with 'summary' and 'meta' objects)"),
    ("requests.csv", "a,b\n", "missing column(s) ['request_id', 'tenant', 'session_id', 'priority',"
                              " 'num_prompt_tokens'] and 16 more"),
    ("requests.csv", "", "not a table servesim wrote (No columns to parse from file)"),
])
def test_plot_and_report_of_a_damaged_run_folder_name_the_file(capsys, tmp_path, saved_run, name, content, message):
    import shutil
    folder = tmp_path / "broken"
    shutil.copytree(saved_run, folder)
    (folder / name).write_text(content)
    for command in ("plot", "report"):
        code, _, err = run_cli(capsys, command, str(folder))
        assert code == 2 and err == f"servesim: error: {name}='{folder / name}': {message}\n"


def test_output_paths_name_the_flag_and_what_is_wrong(capsys, tmp_path, saved_run):
    taken = tmp_path / "taken"
    taken.write_text("a file")
    not_folder = "exists and is not a folder; choose a folder path\n"
    plan = Path(__file__).resolve().parents[1] / "examples" / "plan.toml"
    cases = [
        (["run", *FAST, "--save-result", "--result-dir", str(taken)], f"--result-dir='{taken}': {not_folder}"),
        (["plot", str(saved_run), "--out", str(taken)], f"--out='{taken}': {not_folder}"),
        (["capacity", "--config", str(plan), "--out", str(taken)], f"--out='{taken}': {not_folder}"),
        (["report", str(saved_run), "--out", str(tmp_path)], f"--out='{tmp_path}': is a folder; give a file path\n"),
        (["report", str(saved_run), "--out", str(tmp_path / "no" / "r.html")],
         f"--out='{tmp_path / 'no' / 'r.html'}': folder {tmp_path / 'no'} does not exist\n"),
        (["run", *FAST, "--save-result", "--result-dir", str(tmp_path), "--result-filename", "a/b.json"],
         f"--result-filename='a/b.json': folder {tmp_path / 'a'} does not exist\n"),
        (["calibrate", "--from-run", str(taken)], f"--from-run='{taken}': neither a run folder (with meta.json and"
                                                  " requests.jsonl) nor a vllm bench serve result (.json)\n"),
    ]
    for argv, message in cases:
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and err == f"servesim: error: {message}", argv


def test_an_output_folder_that_cannot_be_created_is_named(capsys, tmp_path, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(Path, "mkdir", refuse)
    code, _, err = run_cli(capsys, "run", *FAST, "--out", str(tmp_path / "x"))
    assert code == 2
    assert err == f"servesim: error: --out='{tmp_path / 'x'}': cannot create folder: Operation not permitted\n"


def test_disagg_transfer_lines_keep_a_space_between_label_and_value():
    from sim.cli.disagg import TRANSFER_LINES, pool_lines
    summary = {f"{pool}_kv_occupancy_{k}": 0.5 for pool in ("prefill", "decode") for k in ("mean", "peak")}
    summary.update({key: 123.0 for key, _, _, _ in TRANSFER_LINES})
    for line, (_, label, _, _) in zip(pool_lines(summary)[2:], TRANSFER_LINES):
        assert line.startswith(label + " ") and line.split()[-1][0].isdigit()


def _help_of(*command) -> str:
    parser = build_parser()
    for name in command:
        parser = parser._subparsers._group_actions[0].choices[name]
    return " ".join(parser.format_help().split())


def test_run_help_states_the_defaults_servesim_runs_with():
    """`servesim run --help` named no default for the rate, request count, model, GPU, seed, block size ...;
    the ones it now states are the config's own defaults."""
    from sim.api.sections import DeploymentConfig, WorkloadConfig
    from sim.api.simulator import SimulationConfig
    from sim.core.config import EngineConfig
    d, w, e = DeploymentConfig(), WorkloadConfig(), EngineConfig()
    text = _help_of("run").split("options:", 1)[1]  # (after the usage lines)
    for flag, default in (("--request-rate R, --rate R", f"default {w.rate:g}"),
                          ("--num-requests N", f"default {w.num_requests}"),
                          ("--lengths PRESET", f"{w.lengths} (the default)"),
                          ("--model MODEL", f"{d.model} (the default)"), ("--gpu GPU", f"{d.gpu} (the default)"),
                          ("--tp N", f"default {d.tensor_parallel_size}"),
                          ("--gpu-memory-utilization F", f"default {d.gpu_memory_utilization:g}"),
                          ("--cost-model {roofline,linear}", f"default {d.cost_model}"),
                          ("--block-size N", f"default {e.block_size}"),
                          ("--long-prefill-token-threshold N", f"default {e.long_prefill_token_threshold}: no cap"),
                          ("--seed SEED", f"default {SimulationConfig().seed}"),
                          ("--plot-format {png,svg,none}", "default png")):
        entry = text.split(flag, 1)[1][:220]
        assert default in entry, (flag, entry)


def test_sweep_capacity_plot_and_disagg_help_state_defaults_and_purpose():
    assert "(default sweep-out)" in _help_of("sweep") and "the default) or ray" in _help_of("sweep")
    assert "(default capacity-out)" in _help_of("capacity")
    assert "image format (default png" in _help_of("plot")
    assert "Simulate a prefill/decode disaggregated deployment" in _help_of("disagg")


def test_a_sweep_file_refused_leaves_no_output_folder(capsys, tmp_path):
    """`servesim sweep --out DIR` made DIR before reading the file, so every refused file left an empty one."""
    path = tmp_path / "sweep.toml"
    path.write_text("[workload]\nnum_requests = 5\n[sweep]\nrate = []\n")
    out = tmp_path / "sweep-out"
    assert main(["sweep", "--config", str(path), "--out", str(out)]) == 2
    assert capsys.readouterr().err == "servesim: error: sweep.rate=[]: must be a non-empty list of values\n"
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["run", "--requets-rate", "5"], "unrecognized arguments: --requets-rate 5; did you mean --request-rate? "
                                     "(see servesim run --help)"),
    (["run", "--stop-profile", "vllm"], "unrecognized arguments: --stop-profile vllm (see servesim run --help)"),
    (["sweep", "--config", "x.toml", "--wokers", "2"], "unrecognized arguments: --wokers 2; did you mean --workers? "
                                                      "(see servesim sweep --help)"),
    (["plot", "a", "b"], "unrecognized arguments: b (see servesim plot --help)"),
])
def test_an_unknown_flag_points_to_its_commands_help_and_the_flag_it_resembles(capsys, argv, message):
    """It pointed to `servesim --help`, whose page lists no flag of `servesim run`."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err == f"servesim: error: {message}\n"


def test_a_ray_address_without_the_ray_executor_is_a_usage_error(capsys, tmp_path):
    """`servesim sweep --address ray://head:10001` ran on the local process pool and ignored the address."""
    assert main(["sweep", "--config", "examples/sweep.toml", "--out", str(tmp_path / "o"), "--address", "ray://x"]) == 2
    assert capsys.readouterr().err == ("servesim: error: --address='ray://x': joins a Ray cluster: give it with "
                                       "--executor ray (the executor is pool)\n")
    assert not (tmp_path / "o").exists()


def test_num_prompts_beyond_a_traces_rows_says_all_were_replayed(capsys, tmp_path):
    """`--trace t.csv --num-prompts 50` of a 2-row trace printed '2 completed of 2' and nothing else (vllm
    bench serve would have oversampled to 50)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,7\n")
    argv = ["run", "--trace", str(trace), "--cost-model", "linear", "--no-progress", "--json"]
    assert main([*argv, "--num-prompts", "50"]) == 0
    assert capsys.readouterr().err == ("servesim: warning: --num-prompts 50 asks for more requests than the file "
                                       "gives: all 2 of them were replayed\n")
    assert main([*argv, "--num-prompts", "2"]) == 0 and capsys.readouterr().err == ""


@pytest.mark.parametrize("command", [["sweep", "--config", "examples/sweep.toml"],
                                     ["capacity", "--config", "examples/plan.toml"]])
def test_a_bad_workers_count_is_named_as_the_flag(capsys, tmp_path, command):
    """It was named `workers=0`, the Python argument, not the flag the user typed."""
    assert main([*command, "--out", str(tmp_path / "o"), "--workers", "0"]) == 2
    assert capsys.readouterr().err == "servesim: error: --workers=0: must be an integer >= 1 (unset: all cores)\n"
