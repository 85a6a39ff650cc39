"""Each value the fuzz campaign found accepted silently, or crashing, is now a named error (or works)."""
from __future__ import annotations

import numpy as np
import pytest

from kernels_cost_model.errors import ConfigError
from sim import SamplingParams, SimulationConfig, simulate
from sim.cli import main
from sim.core.text import byte_token_text
from workloads import poisson_workload
from workloads.spec import RequestSpec

LINEAR = {"cost_model": "linear"}


@pytest.mark.parametrize("data, field, reason", [
    ({"workload": {"num_requests": True}}, "workload.num_requests", "must be an integer"),
    ({"workload": {"ignore_eos": "yes"}}, "workload.ignore_eos", "must be true or false"),
    ({"engine": {"enable_prefix_caching": "false"}}, "engine.enable_prefix_caching", "must be true or false"),
    ({"engine": {"max_num_seqs": 8.0}}, "engine.max_num_seqs", "must be an integer"),
    ({"slo": {"ttft_s": "1s"}}, "slo.ttft_s", "must be a number or null"),
    ({"slo": {"ttft_s": 0}}, "slo.ttft_s", "must be a duration in (0,"),
    ({"slo": {"tpot_s": -0.05}}, "slo.tpot_s", "must be a duration in (0,"),
    ({"seed": True}, "seed", "must be an integer >= 0"),
    ({"workload": {"rate": "fast"}}, "workload.rate", "must be a number"),
    ({"workload": {"rate": 1e-300}}, "workload.rate", "must be in [1e-06,"),
    ({"workload": {"rate": float("nan")}}, "workload.rate", "must be a number"),
    ({"workload": {"cv": 2.0}}, "workload.cv", "not used by kind = 'poisson'"),
    ({"workload": {"path": "t.csv"}}, "workload.path", "not used by kind = 'poisson'"),
    ({"workload": {"kind": "sessions", "max_tokens": 64}}, "workload.max_tokens", "not used by kind = 'sessions'"),
    ({"workload": {"kind": "closed_loop", "num_users": 2, "rate": 3.0}}, "workload.rate",
     "not used by kind = 'closed_loop'"),
    ({"workload": {"num_requests": 10**12}}, "workload.num_requests", "must be in [1, 10000000]"),
    ({"engine": {"num_gpu_blocks": 10**9}}, "engine.num_gpu_blocks", "KV bookkeeping is kept per block"),
    ({"workload": {"shared_prefix_len": 10**11}}, "workload.shared_prefix_len", "must not exceed engine.max_model_len"),
    ({"deployment": {"collective_scale": float("inf")}}, "deployment.collective_scale", "must be a number"),
])
def test_bad_values_are_named(data, field, reason):
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_dict(data)
    assert info.value.field == field and reason in info.value.reason


def test_switching_kind_drops_the_old_kinds_settings_but_not_new_ones():
    gamma = SimulationConfig().replace(workload={"kind": "gamma", "cv": 3.0})
    assert gamma.replace(workload={"kind": "poisson"}).workload.cv is None
    with pytest.raises(ConfigError, match="workload.cv=3.0: not used by kind = 'poisson'"):
        gamma.replace(workload={"kind": "poisson", "cv": 3.0})


@pytest.mark.parametrize("content, reason", [
    (b"", "sets nothing"),
    (b"# only a comment\n", "sets nothing"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "not a text file"),
    (b"[engine\n", "not valid TOML"),
])
def test_unusable_config_files_are_named(tmp_path, capsys, content, reason):
    path = tmp_path / "setup.toml"
    path.write_bytes(content)
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servesim: error: config='{path}': ") and reason in err and err.count("\n") == 1


def test_max_model_len_above_the_models_context_is_refused():
    with pytest.raises(ConfigError, match="exceeds llama-3.1-8b's maximum context of 131072") as err:
        SimulationConfig().replace(engine={"max_model_len": 200_000})   # refused before any run
    assert err.value.field == "engine.max_model_len"


def test_rejecting_requests_warns_loudly():
    config = SimulationConfig().replace(engine={"max_model_len": 128}, deployment=LINEAR,
                                        workload={"num_requests": 50})
    with pytest.warns(UserWarning, match=r"of 50 requests \(\d+%\) were rejected: prompt \+ max_tokens above "
                                         r"engine.max_model_len=128 \(vllm serve refuses them"):
        simulate(config)
    with pytest.warns(UserWarning, match=r"of 50 requests \(\d+%\) were rejected: prompt longer than"):
        simulate(config.replace(engine={"usage_context": "llm_class"}))  # offline: only too-long prompts


def test_vllm_serve_refuses_a_request_whose_prompt_and_max_tokens_exceed_max_model_len():
    """vLLM 0.19's OpenAI server checks prompt + max_tokens against max_model_len before the engine sees
    the request; the offline LLM class lets the engine cut the output there instead."""
    from workloads.spec import RequestSpec
    from sim.core.sampling_params import SamplingParams
    specs = [RequestSpec(0.0, [5] * 100, output_len=None, request_id=f"r{i}",
                         sampling_params=SamplingParams(max_tokens=m, ignore_eos=True))
             for i, m in enumerate((924, 925, None))]
    config = SimulationConfig().replace(engine={"max_model_len": 1024}, deployment=LINEAR)
    with pytest.warns(UserWarning, match="1 of 3 requests"):
        served = simulate(config, workload=specs).requests.set_index("request_id")
    assert list(served["rejected"]) == [False, True, False]          # exactly 1024 fits; None: up to the limit
    offline = simulate(config.replace(engine={"usage_context": "llm_class"}), workload=specs)
    cut = offline.requests.set_index("request_id").loc["r1"]
    assert not cut["rejected"] and cut["finish_reason"] == "length" and cut["num_output_tokens"] == 924


def test_outputs_cut_at_max_model_len_warn(tmp_path, capsys):
    import warnings
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,5000\n0,100,10\n")
    config = SimulationConfig().replace(engine={"max_model_len": 1024, "usage_context": "llm_class"},
                                        deployment=LINEAR, workload={"kind": "trace", "path": str(trace)})
    with pytest.warns(UserWarning, match=r"^1 of 2 requests \(50%\) had their output cut at "
                                         r"engine.max_model_len=1024 \(prompt \+ output tokens\)"):
        simulate(config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        simulate(config.replace(engine={"max_model_len": 8192}))
    assert main(["run", "--trace", str(trace), "--max-model-len", "1024", "--cost-model", "linear", "--json",
                 "--usage-context", "llm_class"]) == 0
    assert "servesim: warning: 1 of 2 requests (50%) had their output cut at engine.max_model_len=1024" \
        in capsys.readouterr().err
    from sim.planning.instances import InstanceShape, simulate_instance  # the topology paths warn too
    with pytest.warns(UserWarning, match=r"^1 of 2 requests \(50%\) had their output cut"):
        simulate_instance(config, InstanceShape())


def test_out_onto_a_file_fails_before_the_run(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("not a folder")
    assert main(["run", "--out", str(target), "--num-requests", "100000"]) == 2  # would take minutes to run
    assert capsys.readouterr().err == (f"servesim: error: --out='{target}': exists and is not a folder;"
                                       " choose a folder path\n")


def test_config_json_without_intermediate_size_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_attention_heads": 4, '
                                          '"num_hidden_layers": 2, "vocab_size": 100}')
    config = SimulationConfig().replace(deployment={"model": str(tmp_path / "config.json")})
    with pytest.raises(ConfigError, match="lacks required key 'intermediate_size'"):
        simulate(config)


def test_every_token_id_has_text_and_stop_strings_work_beyond_the_byte_range():
    assert [byte_token_text(i) for i in (65, 256, 257, 283)] == ["A", "", " a", " ba"]
    texts = {byte_token_text(i) for i in range(257, 5000)}
    assert len(texts) == 5000 - 257  # one word per id
    params = SamplingParams(max_tokens=10, stop=[byte_token_text(8402)])
    spec = RequestSpec(0.0, [1, 2, 3], output_token_ids=(8400, 8401, 8402, 8403), sampling_params=params)
    results = simulate(SimulationConfig().replace(deployment=LINEAR, engine={"num_gpu_blocks": 600}),
                       workload=[spec])
    row = results.requests.iloc[0]
    assert (row.finish_reason, row.stop_reason, row.num_output_tokens) == ("stop", byte_token_text(8402), 3)


@pytest.mark.parametrize("kwargs, field", [
    ({"prompt_token_ids": [1, -2]}, "request.prompt_token_ids"),
    ({"prompt_token_ids": np.array([1, -2], dtype=np.int32)}, "request.prompt_token_ids"),
    ({"prompt_token_ids": [2**40]}, "request.prompt_token_ids"),
    ({"prompt_token_ids": [1.5]}, "request.prompt_token_ids"),
    ({"prompt_token_ids": [1], "output_token_ids": (3, -1)}, "request.output_token_ids"),
    ({"prompt_token_ids": [1], "arrival_time_s": float("inf")}, "request.arrival_time_s"),
])
def test_request_specs_check_their_token_ids_and_times(kwargs, field):
    kwargs = {"arrival_time_s": 0.0, **kwargs}
    with pytest.raises(ConfigError) as info:
        RequestSpec(**kwargs)
    assert info.value.field == field


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--rate", "fast"])
    assert info.value.code == 2
    assert capsys.readouterr().err == ("servesim: error: argument --request-rate/--rate: invalid float value: 'fast'"
                                       " (see servesim run --help)\n")


def test_a_huge_shared_prefix_costs_only_what_the_prompts_use():
    from workloads import poisson_workload
    from workloads.rng import make_rng
    huge = list(poisson_workload(5.0, 20, shared_prefix_len=10**11).iter_requests(make_rng(0, "w")))
    exact = list(poisson_workload(5.0, 20, shared_prefix_len=10**5).iter_requests(make_rng(0, "w")))
    assert all((a.prompt_token_ids == b.prompt_token_ids).all() for a, b in zip(huge, exact))


def test_a_kv_cache_sized_beyond_the_bookkeeping_limit_is_refused_before_allocating():
    config = SimulationConfig().replace(deployment={"model": "qwen2.5-0.5b", "gpu": "mi300x"},
                                        engine={"block_size": 1})
    with pytest.raises(ConfigError, match="engine.block_size=1: qwen2.5-0.5b on mi300x leaves room for"):
        simulate(config)


def test_trace_line_ends_found_by_the_fuzz(tmp_path, capsys):
    header = b"TIMESTAMP,ContextTokens,GeneratedTokens"
    stray = tmp_path / "stray.csv"  # a lone \r after the header was "line 0: new-line character seen"
    stray.write_bytes(header + b"\r-3\n2023-11-16 18:17:03.97,374,44\r\n")
    assert main(["run", "--trace", str(stray), "--cost-model", "linear", "--no-progress"]) == 2
    assert capsys.readouterr().err == f"servesim: error: {stray}:2: 3 columns expected\n"
    old_mac = tmp_path / "cr.csv"  # \r alone ends every line
    old_mac.write_bytes(header + b"\r2023-11-16 18:17:03.97,374,44\r2023-11-16 18:17:04.5,90,12\r")
    assert main(["run", "--trace", str(old_mac), "--cost-model", "linear", "--no-progress", "--json"]) == 0


@pytest.mark.parametrize("kwargs, field, reason", [
    ({"engine": None}, "engine", "must be EngineConfig(...) or a dict of its settings"),
    ({"workload": "poisson"}, "workload", "must be WorkloadConfig(...) or a dict"),
    ({"deployment": "h100"}, "deployment", "must be DeploymentConfig(...) or a dict"),
    ({"slo": {"ttft_s": -1}}, "slo.ttft_s", "must be a duration in (0,"),
    ({"client": {"ttft_s": -5.0}}, "client.ttft_s", "must be a duration in [0,"),
    ({"client": {"ttfx": 5.0}}, "client.ttfx", "unknown setting"),
])
def test_sections_of_the_wrong_type_are_named_at_construction(kwargs, field, reason):
    with pytest.raises(ConfigError) as info:
        SimulationConfig(**kwargs)
    assert info.value.field == field and reason in info.value.reason


def test_a_section_given_as_a_dict_is_built_as_from_dict_builds_it():
    config = SimulationConfig(engine={"max_num_seqs": 4}, slo={"ttft_s": 0.5}, client={"ttft_s": 0.01})
    assert config.engine.max_num_seqs == 4 and config.engine.max_model_len == 131072
    assert config.slo.ttft_s == 0.5 and config.client.ttft_s == 0.01


@pytest.mark.parametrize("sections, field, reason", [
    ({"slo": None}, "slo", "must be SLOConfig(...) or a dict"),
    ({"client": None}, "client", "must be ClientConfig(...) or a dict"),
    ({"engine": 5}, "engine", "must be EngineConfig(...) or a dict"),
    ({"deployment": "h100"}, "deployment", "must be DeploymentConfig(...) or a dict"),
    ({"engin": {"max_num_seqs": 4}}, "engin", "unknown section; known: ['engine', 'deployment'"),
])
def test_replace_names_a_bad_section(sections, field, reason):
    with pytest.raises(ConfigError) as info:
        SimulationConfig().replace(**sections)
    assert info.value.field == field and reason in info.value.reason


@pytest.mark.parametrize("call, value", [
    (lambda: SimulationConfig.from_toml(None), None),
    (lambda: SimulationConfig.from_toml(5), 5),
    (lambda: SimulationConfig.from_dict(None), None),
    (lambda: SimulationConfig.from_dict([1, 2]), [1, 2]),
])
def test_from_toml_and_from_dict_name_an_argument_of_the_wrong_type(call, value):
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.field == "config" and info.value.value == value


def test_a_toml_file_with_a_utf8_bom_is_read(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[workload]\nrate = 7.0\n")
    assert SimulationConfig.from_toml(path).workload.rate == 7.0


def test_numpy_integers_count_as_integers_and_are_stored_as_python_ints():
    import dataclasses
    import json
    import numpy as np
    config = SimulationConfig(seed=np.int64(3)).replace(workload={"num_requests": np.int64(20)},
                                                        engine={"max_num_seqs": np.int32(8)})
    assert (config.seed, config.workload.num_requests, config.engine.max_num_seqs) == (3, 20, 8)
    assert type(config.seed) is int and type(config.workload.num_requests) is int
    assert type(config.engine.max_num_seqs) is int
    json.dumps(dataclasses.asdict(config))
    with pytest.raises(ConfigError, match=r"workload.num_requests=np.True_: must be an integer"):
        config.replace(workload={"num_requests": np.bool_(True)})


SMALL = SimulationConfig().replace(deployment=LINEAR, engine={"num_gpu_blocks": 2000, "max_model_len": 16384},
                                   workload={"num_requests": 5})


@pytest.mark.parametrize("workload, field, reason", [
    ("poisson", "workload", "must be a workload object (with iter_requests or process) or a list of RequestSpec"),
    (5, "workload", "must be a workload object"),
    ([], "workload", "has no requests"),
    ([{"arrival_time_s": 0}], "workload[0]", "must be a RequestSpec, not a dict"),
    ([RequestSpec(0.0, np.arange(8), 4, request_id="a"), RequestSpec(0.5, np.arange(8), 4),
      RequestSpec(1.0, np.arange(8), 4, request_id="a")], "workload[2].request_id", "repeats workload[0]'s"),
])
def test_simulate_names_a_bad_workload_before_the_run(workload, field, reason):
    with pytest.raises(ConfigError) as info:
        simulate(SMALL, workload=workload)
    assert info.value.field == field and reason in info.value.reason


def test_simulate_names_a_bad_progress_or_config():
    with pytest.raises(ConfigError, match=r"progress=5: must be an object with update\(now\)"):
        simulate(SMALL, progress=5)
    with pytest.raises(ConfigError, match="config=.*must be a SimulationConfig"):
        simulate({"workload": {"num_requests": 5}})


@pytest.fixture(scope="module")
def small_results():
    return simulate(SMALL)


@pytest.mark.parametrize("ttft_s, reason", [
    (-1, "must be a duration in (0,"), (0, "must be a duration in (0,"),
    (float("nan"), "must be a number"), ("500ms", "must be a number"),
])
def test_with_slo_checks_targets_as_slo_config_does(small_results, ttft_s, reason):
    with pytest.raises(ConfigError) as info:
        small_results.with_slo(ttft_s=ttft_s)
    assert info.value.field == "slo.ttft_s" and reason in info.value.reason


@pytest.mark.parametrize("percentiles, value", [
    ([101], 101), ([-5], -5), ([0], 0), (["p99"], "p99"), ("99", "99"), ([50, float("nan")], None),
])
def test_with_percentiles_names_a_bad_percentile(small_results, percentiles, value):
    with pytest.raises(ConfigError) as info:
        small_results.with_percentiles(percentiles)
    assert info.value.field == "percentiles" and "(0, 100)" in info.value.reason
    assert value is None or info.value.value == value


def test_with_percentiles_takes_a_bare_number_and_numpy_numbers(small_results):
    import numpy as np
    assert "p99.9_ttft_ms" in small_results.with_percentiles(99.9).summary
    summary = small_results.with_percentiles(np.array([50.0, 95.0])).summary
    assert "p95_ttft_ms" in summary


def test_run_engine_errors_name_the_engine_section(capsys, tmp_path):
    path = tmp_path / "linear.toml"
    path.write_text('[deployment]\ncost_model = "linear"\n[engine]\nnum_gpu_blocks = 10\n')
    assert main(["run", "--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith("servesim: error: engine.num_gpu_blocks=10: KV cache holds 160 tokens")
    argv = ["run", "--num-requests", "20", "--num-gpu-blocks", "100", "--max-model-len", "1600", "--no-progress",
            "--usage-context", "llm_class"]  # (vllm serve refuses such a request before it runs)
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("servesim: error: engine.num_gpu_blocks=100: request 'req-")


def test_a_tensor_parallel_size_the_heads_do_not_divide_is_named_under_deployment(capsys):
    """It was named `engine.tensor_parallel_size=3` (the engine's block size reads it), a field the engine
    section does not have; the fix names the section a user sets it in."""
    with pytest.raises(ConfigError) as info:
        SimulationConfig(deployment={"tensor_parallel_size": 3})
    assert info.value.field == "deployment.tensor_parallel_size" and "num_kv_heads=8" in info.value.reason
    assert main(["run", "--tp", "3"]) == 2
    assert capsys.readouterr().err.startswith("servesim: error: deployment.tensor_parallel_size=3: must divide")
    with pytest.raises(ConfigError) as info:  # the engine's own fields keep their section
        SimulationConfig(engine={"max_model_len": 200_000})
    assert info.value.field == "engine.max_model_len"


@pytest.mark.parametrize("name, command", [("sweep", "servesim sweep"), ("search", "servesim capacity"),
                                           ("target", "servesim capacity"), ("prices", "servesim capacity"),
                                           ("disaggregation", "servesim disagg")])
def test_another_commands_section_says_which_command_reads_it(name, command):
    """`servesim run --config examples/plan.toml` said only "prices={}: unknown section"."""
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_dict({name: {"x": 1}})
    assert info.value.field == name
    assert info.value.reason.startswith(f"unknown section ([{name}] is read by `{command} --config`, not here)")


@pytest.mark.parametrize("command, example, section", [
    ("run", "plan.toml", "prices"), ("run", "sweep.toml", "sweep"), ("run", "disagg.toml", "disaggregation"),
    ("disagg", "sweep.toml", "sweep"), ("sweep", "plan.toml", "prices")])
def test_an_example_file_given_to_the_wrong_command_names_the_right_one(capsys, command, example, section):
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "examples" / example
    assert main([command, "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servesim: error: {section}=") and f"[{section}] is read by `servesim " in err


def test_max_model_len_auto_is_taken_as_vllm_spells_it_in_a_toml_file(tmp_path):
    """`--max-model-len auto` worked, `max_model_len = "auto"` in a TOML file was "must be an integer"."""
    path = tmp_path / "auto.toml"
    path.write_text('[deployment]\nmodel = "qwen3-32b"\n[engine]\nmax_model_len = "auto"\n')
    auto = SimulationConfig.from_toml(path)
    assert auto.auto_max_model_len and auto.engine == SimulationConfig(
        deployment={"model": "qwen3-32b"}, engine={"max_model_len": -1}).engine
    assert auto.engine.max_model_len < 40960  # fitted to one H100's cache
    with pytest.raises(ConfigError, match=r'engine.max_model_len=\'big\': must be an integer, "auto"'):
        SimulationConfig(engine={"max_model_len": "big"})


@pytest.mark.parametrize("sampling_params, field, reason", [
    ({"temperature": 0.5}, "request.sampling_params.temperature", "unknown setting; known: ['max_tokens'"),
    ({"max_tokens": 0}, "request.sampling_params.max_tokens", "must be an integer >= 1"),
    ({7: 1}, "request.sampling_params.7", "unknown setting"),
])
def test_sampling_params_given_as_a_dict_name_a_bad_key_or_value(sampling_params, field, reason):
    """An unknown key raised TypeError from SamplingParams.__init__; a bad value was named without its request."""
    with pytest.raises(ConfigError) as info:
        RequestSpec(0.0, [1, 2, 3], output_len=3, sampling_params=sampling_params)
    assert info.value.field == field and reason in info.value.reason


@pytest.mark.parametrize("make", [
    lambda: iter([]),
    lambda: poisson_workload(1.0, 0),
    lambda: poisson_workload(1.0, duration_s=1e-3),
])
def test_a_workload_that_gives_no_requests_is_named(make):
    """An empty list was named before the run; an empty iterator or a workload of 0 requests returned a
    summary of NaNs ("0 completed of 0")."""
    with pytest.raises(ConfigError) as info:
        simulate(SMALL, workload=make())
    assert info.value.field == "workload" and info.value.reason.startswith("gave no requests: nothing to simulate")
    assert simulate(SMALL, workload=make(), until=5.0).summary["num_requests"] == 0  # a window may hold none


def test_a_max_tokens_vllm_serve_would_refuse_for_every_request_is_named():
    """--max-tokens 100000000 ran, refused all 1000 requests and printed a summary of dashes; behind vllm serve's
    front end no request can have it, so it is a config error (offline, the outputs are cut instead)."""
    with pytest.raises(ConfigError) as info:
        SimulationConfig(engine={"max_model_len": 4096}, workload={"max_tokens": 4096})
    assert info.value.field == "workload.max_tokens" and "so it would refuse every request" in info.value.reason
    assert SimulationConfig(engine={"max_model_len": 4096}, workload={"max_tokens": 4095}).workload.max_tokens == 4095
    offline = SimulationConfig(engine={"max_model_len": 4096, "usage_context": "llm_class"},
                               workload={"max_tokens": 10**6})
    assert offline.workload.max_tokens == 10**6
