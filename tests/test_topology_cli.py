"""`servesim run` topology flags with vLLM's names (-pp, --kv-offloading-size, --conversations) and
`servesim capacity` over topologies."""
import json

import pytest

from sim.cli.main import build_parser, main

FAST = ["--num-prompts", "30", "--request-rate", "20", "--cost-model", "linear", "--json"]


def summary(capsys, *argv) -> dict:
    assert main(["run", *FAST, *argv]) == 0
    return json.loads(capsys.readouterr().out)


def error(capsys, *argv) -> str:
    assert main(["run", *FAST, *argv]) == 2
    return capsys.readouterr().err


def test_pp_names_are_aliases():
    parse = build_parser().parse_args
    assert parse(["run", "-pp", "2"]) == parse(["run", "--pipeline-parallel-size", "2"]) == parse(["run", "--pp", "2"])


def test_pp_one_is_the_plain_run(capsys):
    assert summary(capsys, "-pp", "1") == summary(capsys)


def test_pp_runs_a_pipeline(capsys):
    s = summary(capsys, "-pp", "2")
    assert s["num_gpus"] == 2 and 1 <= s["max_batches_in_flight"] <= 2 and s["completed"] == 30


def test_the_header_counts_every_gpu_of_a_pipeline(capsys):
    assert main(["run", *FAST[:-1], "--tp", "2", "-pp", "2"]) == 0
    assert "llama-3.1-8b on 4x (TP 2 x PP 2) h100" in capsys.readouterr().out.splitlines()[0]
    assert main(["run", *FAST[:-1], "--tp", "2"]) == 0
    assert "llama-3.1-8b on 2x h100" in capsys.readouterr().out.splitlines()[0]


def test_kv_offloading_size_adds_a_cpu_tier(capsys):
    s = summary(capsys, "--kv-offloading-size", "4", "-pp", "2")
    assert s["cpu_prefix_hit_rate"] >= 0 and "cpu_offloaded_blocks" in s and s["completed"] == 30


def test_the_printed_summary_shows_the_cpu_tier(capsys):
    assert main(["run", *FAST[:-1], "--kv-offloading-size", "4"]) == 0
    tier = [line for line in capsys.readouterr().out.splitlines() if line.startswith("CPU KV tier")]
    assert len(tier) == 1 and "% from CPU" in tier[0] and "loaded back" in tier[0]
    assert main(["run", *FAST[:-1]]) == 0
    assert "CPU KV tier" not in capsys.readouterr().out


@pytest.mark.parametrize("argv, named", [
    (["-pp", "33"], "pipeline.pipeline_parallel_size=33"),            # 32 layers
    (["--kv-offloading-size", "1e-9"], "--kv-offloading-size=1e-09"),  # smaller than one block
    (["--kv-offloading-size", "4", "--no-enable-prefix-caching"], "--kv-offloading-size=4.0"),
    (["--kv-offloading-size", "4", "--kv-offloading-link", "smoke-signals"], "--kv-offloading-link"),
    (["--kv-offloading-size", "inf"], "--kv-offloading-size=inf: must be a finite number of GiB in (0, 100000]"),
    (["--kv-offloading-size", "1e12"], "--kv-offloading-size=1000000000000.0: must be a finite number of GiB"),
    (["-pp", "2", "--speculative-config", '{"method": "eagle3"}'],
     "speculative_config.method='eagle3': not simulated with pipeline_parallel_size=2"),
    (["--conversations", "/nonexistent/trace.jsonl"], "--conversations"),
    (["-pp", "2", "--max-num-batched-tokens", "10", "--max-num-seqs", "64"], "engine.max_num_batched_tokens=10: must be >= max_num_seqs"),
    (["--kv-offloading-size", "4", "--max-num-batched-tokens", "10", "--max-num-seqs", "64"], "engine.max_num_batched_tokens=10"),
])
def test_bad_topology_flags_are_named_errors(capsys, argv, named):
    assert named in error(capsys, *argv)


CONVERSATION_RUN = ["run", "--cost-model", "linear", "--json"]


def _mooncake_file(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1800, "output_length": 20, "hash_ids": [0, 1, 2, 3]},
            {"timestamp": 500, "input_length": 900, "output_length": 10, "hash_ids": [0, 7]},
            {"timestamp": 4000, "input_length": 2600, "output_length": 30, "hash_ids": [0, 1, 2, 4, 5, 6]}]
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def conversations(capsys, *argv) -> dict:
    assert main([*CONVERSATION_RUN, *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_conversations_replay_a_mooncake_trace(capsys, tmp_path):
    path = _mooncake_file(tmp_path)
    s = conversations(capsys, "--conversations", str(path))
    assert s["num_requests"] == s["completed"] == 3 and s["total_output_tokens"] == 60
    assert s["prefix_cache_hit_rate"] > 0      # the third request continues the first's conversation
    capped = conversations(capsys, "--conversations", str(path), "--num-prompts", "2")
    assert capped["num_requests"] == 2


def test_the_header_and_saved_config_name_the_conversation_file(capsys, tmp_path):
    path = _mooncake_file(tmp_path)
    assert main(["run", "--cost-model", "linear", "--conversations", str(path), "--out", str(tmp_path / "out")]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("llama"))
    assert f"conversations {path} (closed loop)" in header and "poisson" not in header
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())["meta"]["config"]["workload"]
    assert saved == {"kind": "conversations", "path": str(path), "num_requests": 3, "ignore_eos": True,
                     "time_scale": 1.0}


@pytest.mark.parametrize("argv, message", [
    (["--trace", "x.csv"], "cannot be combined with --trace"),
    (["--request-rate", "50"], "cannot be combined with --request-rate"),
    (["--workload", "closed_loop", "--num-users", "3"], "cannot be combined with --workload, --num-users"),
    (["--max-tokens", "5"], "cannot be combined with --max-tokens"),
])
def test_conversations_reject_the_workload_flags_they_would_ignore(capsys, tmp_path, argv, message):
    path = _mooncake_file(tmp_path)
    assert main([*CONVERSATION_RUN, "--conversations", str(path), *argv]) == 2
    assert f"--conversations='{path}': replays the file's own traffic; it {message}" in capsys.readouterr().err


def test_conversations_reject_a_config_workload_they_would_ignore(capsys, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[workload]\nkind = "closed_loop"\nnum_users = 2\n')
    assert main([*CONVERSATION_RUN, "--config", str(config), "--conversations", str(_mooncake_file(tmp_path))]) == 2
    assert "the config's [workload] settings {'kind': 'closed_loop', 'num_users': 2}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["inf", "-1", "nan", "0"])
def test_conversation_time_scale_must_be_finite_and_positive(capsys, tmp_path, value):
    path = _mooncake_file(tmp_path)
    assert main([*CONVERSATION_RUN, "--conversations", str(path), "--conversation-time-scale", value]) == 2
    assert f"--conversation-time-scale={float(value)}: must be a finite number > 0" in capsys.readouterr().err


def test_conversation_time_scale_needs_a_mooncake_conversation_file(capsys, tmp_path):
    assert main([*CONVERSATION_RUN, "--conversation-time-scale", "2"]) == 2
    assert "--conversation-time-scale=2.0: applies only with --conversations" in capsys.readouterr().err
    from tests.test_conversations import _otel_fixture
    spans = _otel_fixture(tmp_path)
    for flag in ("--conversation-time-scale", "--num-prompts"):
        assert main([*CONVERSATION_RUN, "--conversations", str(spans), flag, "2"]) == 2
        assert f"{flag}=2" in capsys.readouterr().err
    table = tmp_path / "turns.csv"   # neither kind: the file is named, not the flag (it once was)
    table.write_text("a,b\n1,2\n")
    assert main([*CONVERSATION_RUN, "--conversations", str(table), "--num-prompts", "2"]) == 2
    assert f"{table}:1: not JSON" in capsys.readouterr().err


TOPOLOGY_PLAN = """
seed = 0
[deployment]
cost_model = "linear"
[engine]
num_gpu_blocks = 2048
max_model_len = 4096
[workload]
num_requests = 20
max_tokens = 16
rate = 10.0
[target]
rate = 10.0
ttft_p99_s = 0.5
[search]
topologies = ["aggregated", "disaggregated"]
pd_ratios = ["1:1"]
seeds = [0]
rel_tol = 0.2
executor = "serial"
curve_points = [1.0]
[prices]
h100 = 3.0
"""


def test_capacity_ranks_topologies(capsys, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(TOPOLOGY_PLAN)
    assert main(["capacity", "--config", str(plan), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "h100 TP1 agg" in out and "h100 TP1 1P:1D" in out and "goodput_per_gpu" in out
    assert (tmp_path / "out" / "deployments.csv").read_text().count("\n") == 3   # header + 2 rows


def test_capacity_names_a_bad_topology(capsys, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(TOPOLOGY_PLAN.replace('pd_ratios = ["1:1"]', 'pd_ratios = ["1:x"]'))
    assert main(["capacity", "--config", str(plan), "--out", str(tmp_path / "out")]) == 2
    assert "search.pd_ratios" in capsys.readouterr().err


def test_disagg_first_token_flag(capsys, tmp_path):
    config = tmp_path / "pd.toml"
    config.write_text('[deployment]\ncost_model = "linear"\n[workload]\nnum_requests = 10\n[disaggregation]\n')
    assert main(["disagg", "--config", str(config)]) == 0
    assert "first token from decode" in capsys.readouterr().out
    assert main(["disagg", "--config", str(config), "--first-token", "prefill"]) == 0
    assert "first token from prefill" in capsys.readouterr().out


@pytest.mark.parametrize("argv, warning", [
    (["--pipeline-link", "pcie5"], "--pipeline-link prices the sends between pipeline stages; without "
                                   "--pipeline-parallel-size > 1 it changes nothing"),
    (["--pipeline-link", "pcie5", "-pp", "1"], "--pipeline-link prices the sends between pipeline stages; without "
                                               "--pipeline-parallel-size > 1 it changes nothing"),
    (["--kv-offloading-link", "pcie4"], "--kv-offloading-link prices the CPU KV tier's copies; without "
                                        "--kv-offloading-size it changes nothing")])
def test_a_link_flag_without_what_it_prices_says_it_changes_nothing(capsys, argv, warning):
    """As --save-detailed without --save-result: a warning, and the run is the plain one."""
    assert main(["run", *FAST, *argv]) == 0
    out = capsys.readouterr()
    assert out.err == f"servesim: warning: {warning}\n"
    assert json.loads(out.out) == summary(capsys)


def test_a_link_flag_with_what_it_prices_is_used_and_says_nothing(capsys):
    piped = summary(capsys, "-pp", "2", "--pipeline-link", "ethernet-100g")
    assert "warning" not in capsys.readouterr().err
    assert piped != summary(capsys, "-pp", "2")         # the slower link shows
    tier = summary(capsys, "--kv-offloading-size", "4", "--kv-offloading-link", "pcie4")
    assert "warning" not in capsys.readouterr().err and tier["cpu_offloaded_blocks"] > 0
