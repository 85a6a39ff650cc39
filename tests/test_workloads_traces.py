"""Trace readers and replay: the public traces' published statistics, prefix ids, bad input."""
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from kernels_cost_model.errors import ConfigError
from workloads import SyntheticWorkload, TraceFormatError, TraceTimes, TraceWorkload, make_rng, read_trace

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")

# file, rows, input mean, output mean, rate (req/s), inter-arrival CV: /work/shared/data/README.md
PUBLISHED = [
    ("azure_llm_2023/AzureLLMInferenceTrace_code.csv", 8819, 2047.8, 27.9, 2.567, 13.15),
    ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv", 19366, 1154.7, 211.1, 5.530, 1.09),
    ("mooncake_fast25/conversation_trace.jsonl", 12031, 12035.1, 342.6, 3.401, 3.03),
    ("mooncake_fast25/synthetic_trace.jsonl", 3993, 15325.5, 149.1, 3.907, 1.01),
]


@needs_data
@pytest.mark.parametrize("rel, rows, p_mean, o_mean, rate, cv", PUBLISHED)
def test_public_traces_match_published_statistics(rel, rows, p_mean, o_mean, rate, cv):
    stream = read_trace(DATA / rel)
    assert inspect.isgenerator(stream)
    t, p, o = (np.array(col) for col in zip(*((r.arrival_s, r.prompt_len, r.output_len) for r in stream)))
    gaps = np.diff(t)
    assert t.size == rows and t[0] == 0.0
    assert round(p.mean(), 1) == p_mean and round(o.mean(), 1) == o_mean
    assert round(rows / (t[-1] - t[0]), 3) == rate
    assert round(gaps.std() / gaps.mean(), 2) == cv


@needs_data
def test_azure_replay_is_benchmark_style_and_hits_target_rate():
    workload = TraceWorkload(DATA / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv", target_rate=20.0,
                             max_requests=3000)
    specs = list(workload.iter_requests(make_rng(0, "azure")))
    times = np.array([s.arrival_time_s for s in specs])
    assert len(specs) == 3000 and times[0] == 0 and np.all(np.diff(times) >= 0)
    assert len(specs) / times[-1] == pytest.approx(20.0)
    first = specs[0]
    assert (first.request_id, first.num_prompt_tokens, first.output_len) == ("req-0", 374, 44)
    assert first.sampling_params.max_tokens == 44 and first.sampling_params.ignore_eos


@needs_data
def test_mooncake_hash_ids_give_shared_prefixes():
    path = DATA / "mooncake_fast25/conversation_trace.jsonl"
    rows = list(TraceWorkload(path, max_requests=60).rows())
    specs = list(TraceWorkload(path, max_requests=60).iter_requests(make_rng(0)))
    assert [s.num_prompt_tokens for s in specs] == [r.prompt_len for r in rows]
    shared_pairs = 0
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            a, b = rows[i].hash_ids, rows[j].hash_ids
            k = next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            pa, pb = specs[i].prompt_token_ids, specs[j].prompt_token_ids
            n = min(k * 512, pa.size, pb.size)
            assert np.array_equal(pa[:n], pb[:n])
            if k < min(len(a), len(b)):  # first differing block differs in its ids
                assert not np.array_equal(pa[k * 512:k * 512 + 64], pb[k * 512:k * 512 + 64])
            shared_pairs += k > 0
    assert shared_pairs > 100  # the trace's first requests share a system-prompt block


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def test_azure_crlf_7_digits_and_timezones(tmp_path):
    path = write(tmp_path, "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                 "2024-05-10 23:59:59.9999999+00:00,10,2\r\n2024-05-11 00:00:00.5000001+00:00,20,3")
    rows = list(read_trace(path))
    assert [r.line for r in rows] == [2, 3] and rows[1].arrival_s == pytest.approx(0.5000002, abs=1e-9)
    assert (rows[1].prompt_len, rows[1].output_len) == (20, 3)


@pytest.mark.parametrize("name, text, match", [
    ("az.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.97,5\n", r"az.csv:1: missing column.*GeneratedTokens"),
    ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,5,1\n2023-11-16 18:17:03.9,-5,1\n",
     r"az.csv:3: ContextTokens='-5' must be an integer >= 1"),
    ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,5,1\n2023-11-16 18:17:02.9,5,1\n",
     r"az.csv:3: TIMESTAMP goes backwards: 1 s before the previous row's; a trace's rows must be sorted"),
    ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n", r"az.csv:2: bad timestamp"),
    ("mc.jsonl", '{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}\n'
                 '{"timestamp": 4, "input_length": 10, "output_length": 3, "hash_ids": [0]}\n',
     r"mc.jsonl:2: timestamp goes backwards: 0.001 s before the previous row's"),
    ("mc.jsonl", '{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [0]}\n',
     r"mc.jsonl:1: 1 hash_ids of 512 tokens cannot cover 600"),
    ("mc.jsonl", '{"timestamp": 5, "input_length": 6, "output_length": 3, "hash_ids": [0]}\n{oops\n',
     r"mc.jsonl:2: invalid JSON"),
    ("g.csv", "arrival_s,prompt_tokens\n0,5\n", r"g.csv:1: missing column.*output_tokens"),
    ("g.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,2\n1,5,-2\n", r"g.csv:3: output_tokens='-2'"),
    ("g.jsonl", '{"arrival_s": 0, "prompt_tokens": 4}\n', r"g.jsonl:1: missing field.*output_tokens"),
    ("g.csv", "", r"g.csv:1: empty file: expected a header row with columns \['arrival_s'"),
    ("g.csv", "arrival_s,prompt_tokens,output_tokens\n", r"g.csv:1: no requests: the file has no data rows"),
    ("g.jsonl", "\n\n", r"g.jsonl:1: no requests"),
])
def test_bad_traces_name_file_and_line(tmp_path, name, text, match):
    path = write(tmp_path, name, text)
    with pytest.raises(TraceFormatError, match=match):
        list(TraceWorkload(path).iter_requests(make_rng(0)))


@pytest.mark.parametrize("text, message", [
    ("", "t.csv:1: empty file"),
    ("arrival_s,prompt_tokens,output_tokens\n", "t.csv:1: no requests"),
])
def test_an_empty_trace_is_an_error_through_the_cli_and_simulate(tmp_path, capsys, text, message):
    from sim import SimulationConfig, simulate
    from sim.cli.main import main
    path = write(tmp_path, "t.csv", text)
    assert main(["run", "--trace", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servesim: error: {path.parent}/{message}") and err.count("\n") == 1
    with pytest.raises(TraceFormatError, match=message):
        simulate(SimulationConfig().replace(workload={"kind": "trace", "path": str(path)}))


def test_burstgpt_skips_failed_requests_and_tags_model(tmp_path):
    path = write(tmp_path, "burst.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,0,1087,Conversation log\n"
                 "118,ChatGPT,417,276,693,API log\n")
    with pytest.warns(UserWarning, match=r"burst.csv: 1 row\(s\) with 0 generated tokens \(failed requests\) were "
                                         r"skipped \(line 3\)"):  # (said once the rows are read: not silently)
        specs = list(TraceWorkload(path).iter_requests(make_rng(0)))
    assert [(s.arrival_time_s, s.tenant, s.output_len) for s in specs] == [(0.0, "ChatGPT", 18), (113.0, "ChatGPT", 276)]
    with pytest.raises(TraceFormatError, match="burst.csv:3: 0 generated tokens"):
        list(TraceWorkload(path, zero_output="error").iter_requests(make_rng(0)))
    assert [s.output_len for s in TraceWorkload(path, zero_output="one").iter_requests(make_rng(0))] == [18, 1, 276]


@pytest.mark.parametrize("name, text", [
    ("g.csv", "arrival_s,prompt_tokens,output_tokens\n0,100,0\n1,100,0\n"),
    ("burst.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                  "0,ChatGPT,100,0,100,Conversation log\n5,ChatGPT,100,0,100,Conversation log\n"),
])
def test_a_trace_of_only_failed_requests_is_an_error_not_an_empty_run(tmp_path, capsys, name, text):
    from sim.cli.main import main
    path = write(tmp_path, name, text)
    message = f"{path}:1: no requests left: all 2 row(s) have 0 generated tokens (failed requests) and were skipped"
    with pytest.raises(TraceFormatError, match=re.escape(message)):
        list(TraceWorkload(path).iter_requests(make_rng(0)))
    assert main(["run", "--trace", str(path)]) == 2
    assert capsys.readouterr().err == f"servesim: error: {message}\n"


def test_target_rate_needs_arrivals_that_span_some_time(tmp_path, capsys):
    from sim.cli.main import main
    path = write(tmp_path, "g.csv", "arrival_s,prompt_tokens,output_tokens\n0,100,10\n0,100,10\n0,100,10\n")
    with pytest.raises(ConfigError, match=r"target_rate=10.0: the trace's 3 arrivals span 0 s"):
        TraceWorkload(path, target_rate=10.0).scale()
    assert main(["run", "--trace", str(path), "--target-rate", "10"]) == 2
    assert "servesim: error: workload.target_rate=10.0: the trace's 3 arrivals span 0 s" in capsys.readouterr().err
    one = write(tmp_path, "one.csv", "arrival_s,prompt_tokens,output_tokens\n0,100,10\n")
    assert TraceWorkload(one, target_rate=10.0).scale() == 1.0


@pytest.mark.parametrize("name, row, message", [
    ("g.jsonl", '{"arrival_s": 0, "prompt_tokens": true, "output_tokens": 10}', "prompt_tokens=true must be a JSON integer"),
    ("g.jsonl", '{"arrival_s": 0, "prompt_tokens": "100", "output_tokens": 10}',
     'prompt_tokens="100" must be a JSON integer'),
    ("g.jsonl", '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": false}', "output_tokens=false must be"),
    ("g.jsonl", '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 1, "priority": "1"}', 'priority="1" must be'),
    ("g.jsonl", '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 1, "hash_ids": [1], "block_size": "16"}',
     'block_size="16" must be'),
    ("g.jsonl", '{"arrival_s": 0, "prompt_tokens": "10", "output_tokens": 1, "hash_ids": [1]}',
     'prompt_tokens="10" must be'),
    ("g.jsonl", '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 1, "session_id": {"a": 1}}',
     "session_id={'a': 1} must be a string or a number"),
    ("mc.jsonl", '{"timestamp": 0, "input_length": true, "output_length": 3, "hash_ids": [0]}',
     "input_length=true must be a JSON integer"),
])
def test_jsonl_token_counts_must_be_json_integers(tmp_path, name, row, message):
    path = write(tmp_path, name, row + "\n")
    with pytest.raises(TraceFormatError, match=re.escape(f"{path}:1: {message}")):
        list(read_trace(path))


def test_generic_schema_prefixes_sessions_and_scaling(tmp_path):
    path = write(tmp_path, "g.csv", "arrival_s,prompt_tokens,output_tokens,session_id,prefix_id,prefix_tokens,priority\n"
                 "10,300,5,a,sys,200,1\n11,250,6,a,sys,200,\n12.5,100,7,,,,\n14,400,8,b,other,200,0\n")
    specs = list(TraceWorkload(path, time_scale=2.0, ignore_eos=False, max_tokens=64).iter_requests(make_rng(0)))
    assert [s.arrival_time_s for s in specs] == [0.0, 2.0, 5.0, 8.0]
    assert [s.session_id for s in specs] == ["a", "a", None, "b"] and specs[0].priority == 1
    ids = [s.prompt_token_ids for s in specs]
    assert np.array_equal(ids[0][:200], ids[1][:200]) and not np.array_equal(ids[0][:200], ids[3][:200])
    assert specs[0].sampling_params.max_tokens == 64 and not specs[0].sampling_params.ignore_eos
    again = list(TraceWorkload(path, time_scale=2.0).iter_requests(make_rng(0)))
    assert all(np.array_equal(a.prompt_token_ids, b.prompt_token_ids) for a, b in zip(specs, again))
    jpath = write(tmp_path, "g.jsonl", '{"arrival_s": 0, "prompt_tokens": 20, "output_tokens": 2, "hash_ids": [7, 8], '
                  '"block_size": 16}\n{"arrival_s": 1, "prompt_tokens": 10, "output_tokens": 2, "hash_ids": [7], '
                  '"block_size": 16}\n{"arrival_s": 2, "prompt_tokens": 10, "output_tokens": 2, "hash_ids": [9], '
                  '"block_size": 16}\n')
    a, b, c = TraceWorkload(jpath, format="generic").iter_requests(make_rng(0))
    assert (a.num_prompt_tokens, b.num_prompt_tokens) == (20, 10)
    assert np.array_equal(a.prompt_token_ids[:10], b.prompt_token_ids)
    assert not np.array_equal(b.prompt_token_ids, c.prompt_token_ids)


def test_trace_workload_parameters():
    with pytest.raises(ConfigError, match="format"):
        TraceWorkload("x.csv", format="parquet")
    with pytest.raises(ConfigError, match="target_rate"):
        TraceWorkload("x.csv", target_rate=0)
    with pytest.raises(ConfigError, match="not both"):
        TraceWorkload("x.csv", target_rate=1.0, time_scale=2.0)


LENGTH_STATS = [
    ("sharegpt_8k_filtered_stats_llama2_tokenizer.csv", 30731, 2340.0, 438.7),
    ("arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", 28257, 2588.1, 291.4),
    ("bwb_stats_llama2_tokenizer_filtered_v2.csv", 33768, 1067.2, 1612.8),
]


@needs_data
@pytest.mark.parametrize("name, rows, p_mean, o_mean", LENGTH_STATS)
def test_length_stats_files_load_for_empirical_resampling(name, rows, p_mean, o_mean):
    from workloads import EmpiricalPairs
    pairs = EmpiricalPairs.from_csv(DATA / "length_stats" / name)
    assert pairs.prompt_lens.size == rows
    assert round(pairs.prompt_lens.mean(), 1) == p_mean and round(pairs.output_lens.mean(), 1) == o_mean


@needs_data
def test_trace_timestamps_with_preset_lengths():
    times = TraceTimes.from_trace(DATA / "azure_llm_2023/AzureLLMInferenceTrace_code.csv", target_rate=5.0)
    specs = list(SyntheticWorkload(times, "sharegpt", num_requests=8819).iter_requests(make_rng(0)))
    t = np.array([s.arrival_time_s for s in specs])
    assert t[0] == 0 and len(specs) / t[-1] == pytest.approx(5.0)
    with pytest.raises(Exception, match="exceeds the 8819 trace timestamps"):
        list(SyntheticWorkload(times, "sharegpt", num_requests=9000).iter_requests(make_rng(0)))


@pytest.mark.parametrize("kwargs, field", [(dict(target_rate="5"), "target_rate"), (dict(target_rate=True), "target_rate"),
                                           (dict(time_scale="2"), "time_scale"), (dict(max_requests=1.5), "max_requests"),
                                           (dict(max_requests=True), "max_requests"), (dict(tenant=5), "tenant")])
def test_trace_workload_names_a_bad_argument_at_construction(tmp_path, kwargs, field):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n0.5,200,20\n")
    with pytest.raises(ConfigError) as err:
        TraceWorkload(path, **kwargs)
    assert err.value.field == field and err.value.value == next(iter(kwargs.values()))


def test_trace_workload_path_must_be_a_path():
    with pytest.raises(ConfigError, match=r"path=None: must be a path to a trace file"):
        TraceWorkload(None)


def test_skipped_zero_output_rows_are_counted_once_in_a_cli_warning(tmp_path, capsys):
    """`servesim run --trace` of a 3-row trace printed "2 completed of 2" and nothing about the third row,
    whose 0 generated tokens made the replay skip it; it is counted once, even when --target-rate reads
    the file twice."""
    from sim.cli import main
    path = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,0\n2,10,7\n")
    argv = ["run", "--trace", str(path), "--cost-model", "linear", "--no-progress", "--json"]
    assert main([*argv, "--target-rate", "2"]) == 0
    err = capsys.readouterr().err
    assert err.count("servesim: warning: ") == 1
    assert f"{path}: 1 row(s) with 0 generated tokens (failed requests) were skipped (line 3)" in err


@pytest.mark.parametrize("make, reason", [
    (lambda tmp: tmp / "missing.csv", "trace file not found"),
    (lambda tmp: tmp, "is a folder, not a trace file"),
    (lambda tmp: Path("/dev/null"), "is not a regular file (a device or a pipe)"),
])
def test_a_trace_path_that_is_no_file_is_named_through_the_api_and_the_cli(tmp_path, capsys, make, reason):
    """simulate(workload=TraceWorkload(missing)) raised FileNotFoundError from inside SimPy, its file name lost
    in SimPy's rebuild of the exception; `--trace /dev/null` said "trace file not found" of a file that exists."""
    from sim import SimulationConfig, simulate
    from sim.cli import main
    path = make(tmp_path)
    if not path.exists() and path.name != "missing.csv":
        pytest.skip(f"{path} is absent here")
    config = SimulationConfig(deployment={"cost_model": "linear"}, engine={"num_gpu_blocks": 600})
    with pytest.raises(ConfigError, match=re.escape(f"path='{path}': {reason}")):
        simulate(config, workload=TraceWorkload(path))
    assert main(["run", "--trace", str(path), "--cost-model", "linear", "--no-progress"]) == 2
    assert capsys.readouterr().err == f"servesim: error: workload.path='{path}': {reason}" + (
        "; give a trace file\n" if "regular" in reason else "\n")


def test_arrivals_going_backwards_name_the_column_and_the_gap(tmp_path):
    """A generic trace sorted wrongly said "timestamp goes backwards (-4.000000 s < 0.000000 s)": a column it
    does not have, and times rebased to its first row."""
    path = write(tmp_path, "g.jsonl", '{"arrival_s": 5, "prompt_tokens": 10, "output_tokens": 5}\n'
                                      '{"arrival_s": 1, "prompt_tokens": 3, "output_tokens": 5}\n')
    with pytest.raises(TraceFormatError, match=r"g.jsonl:2: arrival_s goes backwards: 4 s before the previous "
                                               r"row's; a trace's rows must be sorted by arrival time"):
        list(read_trace(path))


def test_a_relative_trace_path_not_found_says_where_it_was_looked_for(tmp_path, monkeypatch):
    """A TOML file's `path = "trace.csv"` is read from the current folder, not the file's: say which."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(f"path='trace.csv': trace file not found (relative paths are read "
                                                    f"from the current folder, {tmp_path})")):
        list(read_trace("trace.csv"))
