"""vLLM's names: engine arguments and `vllm bench serve` flags as aliases of the short ones, summary keys,
--percentile-metrics / --metric-percentiles, --save-result in vLLM's schema, --version."""
import json
import re

import numpy as np
import pytest

from sim import SimulationConfig, __version__, simulate
from sim.api.bench_result import bench_serve_result
from sim.cli.main import build_parser, main
from sim.cli.run import config_from_args

FAST = ["--num-prompts", "20", "--request-rate", "20"]


def config_of(*argv):
    return config_from_args(build_parser().parse_args(["run", *argv]))


@pytest.mark.parametrize("vllm, short", [
    (["--tensor-parallel-size", "2"], ["--tp", "2"]),
    (["-tp", "2"], ["--tp", "2"]),
    (["--no-enable-chunked-prefill"], ["--no-chunked-prefill"]),
    (["--no-enable-prefix-caching"], ["--no-prefix-caching"]),
    (["--request-rate", "7"], ["--rate", "7"]),
    (["--num-prompts", "9"], ["--num-requests", "9"]),
    (["--num-gpu-blocks-override", "5000", "--max-model-len", "8192"],
     ["--num-gpu-blocks", "5000", "--max-model-len", "8192"]),
    (["--goodput", "ttft:500", "tpot:50", "e2el:20000"], ["--slo-ttft", "500ms", "--slo-tpot", "50ms",
                                                          "--slo-e2e", "20s"]),
    (["--table-format", "csv"], ["--format", "csv"]),
    (["--burstiness", "0.25"], ["--workload", "gamma", "--cv", "2"]),
])
def test_vllm_names_mean_what_the_short_names_mean(vllm, short):
    if vllm[0] not in ("--goodput", "--burstiness"):  # these keep their own entry; the config is what counts
        assert build_parser().parse_args(["run", *vllm]) == build_parser().parse_args(["run", *short])
    assert config_of(*vllm) == config_of(*short)


def test_vllm_engine_flags_set_their_fields():
    config = config_of("--no-enable-chunked-prefill", "--max-num-batched-tokens", "9000", "--max-model-len", "8192",
                       "--scheduling-policy", "priority", "--async-scheduling", "--no-ignore-eos")
    assert config.engine.enable_chunked_prefill is False and config.engine.scheduling == "priority"
    assert config.engine.async_scheduling is True and config.workload.ignore_eos is False
    assert config_of("--no-async-scheduling").engine.is_async is False
    assert config_of("--enable-chunked-prefill").engine.enable_chunked_prefill is True


def test_plot_format_alias(tmp_path):
    assert (build_parser().parse_args(["plot", "d", "--format", "svg"]).plot_format
            == build_parser().parse_args(["plot", "d", "--plot-format", "svg"]).plot_format == "svg")


def test_version_flag_and_version_in_summary_json(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"servesim {__version__}"
    assert main(["run", *FAST, "--out", str(tmp_path), "--plot-format", "none"]) == 0
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["servesim_version"] == __version__ == doc["meta"]["servesim_version"]


def test_summary_keys_follow_vllm_bench_serve_and_old_keys_still_read():
    results = simulate(SimulationConfig().replace(workload={"num_requests": 30, "rate": 20.0}))
    s, done = results.summary, results.requests[results.requests["completed"]]
    assert s["mean_ttft_ms"] == pytest.approx(1e3 * done["ttft_s"].mean())
    assert s["std_ttft_ms"] == pytest.approx(1e3 * np.std(done["ttft_s"]))  # population std, as vLLM
    assert s["median_e2el_ms"] == pytest.approx(1e3 * done["e2e_s"].median())
    assert s["completed"] == 30 and s["failed"] == 0 and s["total_output_tokens"] == done["num_output_tokens"].sum()
    with pytest.deprecated_call(match="p99_ttft_ms"):
        assert s["ttft_ms_p99"] == s["p99_ttft_ms"]
    with pytest.deprecated_call(match="mean_e2el_ms"):
        assert s["e2e_s_mean"] == pytest.approx(s["mean_e2el_ms"] / 1e3)
    with pytest.deprecated_call():
        assert s["goodput"] == s["request_goodput"]


def test_percentile_flags_shape_the_table_and_the_summary(capsys):
    code = main(["run", *FAST, "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99.9"])
    out = capsys.readouterr().out
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("Latency"))
    assert header.split() == ["Latency", "mean", "median", "p99.9"]
    assert "TTFT (" in out and "E2E latency (" in out and "TPOT" not in out and "ITL" not in out
    assert main(["run", *FAST, "--metric-percentiles", "99.9", "--json"]) == 0
    assert "p99.9_itl_ms" in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("bad", [["--percentile-metrics", "ttft,latency"], ["--metric-percentiles", "101"],
                                 ["--goodput", "ttft=500"], ["--metadata", "novalue"]])
def test_bad_metric_flags_are_usage_errors(capsys, bad):
    with pytest.raises(SystemExit) as exit_:
        main(["run", *FAST, *bad])
    assert exit_.value.code == 2 and "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("value, named", [("50,101", "'101' is not a percentile (must be strictly between 0 and 100)"),
                                          ("50,abc", "'abc' is not a percentile (not a number)")])
def test_a_bad_percentile_is_named_with_its_reason(capsys, value, named):
    with pytest.raises(SystemExit):
        main(["run", *FAST, "--metric-percentiles", value])
    assert named in capsys.readouterr().err


VLLM_KEYS = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
             "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
             "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
             "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests"}


def test_save_result_writes_vllm_bench_serve_json(capsys, tmp_path):
    code = main(["run", *FAST, "--save-result", "--save-detailed", "--result-dir", str(tmp_path),
                 "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99.9",
                 "--goodput", "ttft:500", "--metadata", "run=a", "--json"])
    summary = json.loads(capsys.readouterr().out)
    (path,) = tmp_path.glob("*.json")
    assert code == 0 and re.fullmatch(r"servesim-20\.0qps-llama-3\.1-8b-\d{8}-\d{6}\.json", path.name)
    doc = json.loads(path.read_text())
    assert VLLM_KEYS <= set(doc) and doc["run"] == "a" and doc["servesim_version"] == __version__
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p99.9"):
            assert f"{stat}_{metric}_ms" in doc
        assert doc[f"mean_{metric}_ms"] == pytest.approx(summary[f"mean_{metric}_ms"])
    assert doc["num_prompts"] == doc["completed"] == 20 and doc["request_goodput"] == summary["request_goodput"]
    assert len(doc["ttfts"]) == len(doc["itls"]) == len(doc["input_lens"]) == 20
    assert doc["ttfts"][0] * 1e3 == pytest.approx(json.loads(json.dumps(doc))["ttfts"][0] * 1e3)


@pytest.mark.parametrize("flags, named", [
    (["--label", "x" * 300], "--label='xxxx"), (["--label", "a/b"], "--label='a/b': starts the result file's name"),
    (["--result-filename", "y" * 300], "--result-filename='yyyy"), (["--result-filename", "{dir}"], "is a folder"),
])
def test_a_result_file_name_that_cannot_be_written_is_named_before_the_run(capsys, tmp_path, flags, named):
    """Each once ran the whole simulation, then failed to write (a raw OSError, exit 1 for a long name)."""
    folder = tmp_path / "new"
    flags = [flag.replace("{dir}", str(folder)) for flag in flags]
    assert main(["run", *FAST, "--save-result", "--result-dir", str(folder), *flags]) == 2
    captured = capsys.readouterr()
    assert named in captured.err and not captured.out and not any(folder.glob("*"))


def test_bench_serve_result_from_simulate_uses_vllm_defaults():
    config = SimulationConfig().replace(workload={"num_requests": 20, "rate": 20.0, "kind": "gamma", "cv": 2.0})
    doc = bench_serve_result(simulate(config), date="20250101-000000")
    assert VLLM_KEYS <= set(doc) and doc["burstiness"] == pytest.approx(0.25) and doc["request_goodput"] is None
    assert {k for k in doc if k.endswith("_ms")} == {f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99")
                                                     for m in ("ttft", "tpot", "itl")}
    assert "ttfts" not in doc


def test_a_run_saved_before_the_new_names_loads_with_them(tmp_path):
    from sim.api.results import Results
    results = simulate(SimulationConfig().replace(workload={"num_requests": 10, "rate": 20.0}))
    results.save(tmp_path, "csv")
    doc = json.loads((tmp_path / "summary.json").read_text())
    doc["summary"] = {"num_completed": 10, "ttft_ms_p99": 1.0}  # what servesim 0.1 wrote, in part
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    assert Results.load(tmp_path).summary["p99_ttft_ms"] == pytest.approx(results.summary["p99_ttft_ms"])


@pytest.mark.parametrize("argv, named", [
    (["--goodput", "ttft:500", "--slo-ttft", "300ms"], "--goodput='ttft:500': sets the ttft target that --slo-ttft"
                                                       " or another --goodput item sets to 300 ms"),
    (["--goodput", "ttft:500", "ttft:300"], "--goodput='ttft:300': sets the ttft target that --slo-ttft or another"
                                            " --goodput item sets to 500 ms"),
])
def test_two_values_for_one_slo_target_are_refused(capsys, argv, named):
    """--goodput silently won over --slo-ttft (and the last of two --goodput items over the first)."""
    assert main(["run", *argv]) == 2
    assert capsys.readouterr().err == f"servesim: error: {named}; give each target once\n"
    assert config_of("--goodput", "ttft:500", "e2el:20000", "--slo-ttft", "0.5", "--slo-tpot", "50ms").slo.as_dict() \
        == {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": 20.0}  # the same value twice, or other targets, are fine


def test_result_file_flags_without_save_result_say_they_change_nothing(capsys, tmp_path):
    """--save-detailed, --result-dir, --label ... without --save-result wrote nothing and said nothing."""
    argv = ["run", "--num-requests", "5", "--json", "--no-progress", "--save-detailed", "--result-dir", str(tmp_path)]
    assert main(argv) == 0
    assert capsys.readouterr().err == ("servesim: warning: --save-detailed, --result-dir shape the --save-result file "
                                       "only; without --save-result no result file is written\n")
    assert not list(tmp_path.iterdir())
    assert main([*argv, "--save-result"]) == 0
    assert "servesim: warning" not in capsys.readouterr().err and len(list(tmp_path.iterdir())) == 1
