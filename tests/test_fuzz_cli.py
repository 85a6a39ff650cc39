"""Fuzz: `servesim run` argument strings and TOML text.

Flags get values a user might type, right or wrong (garbage, negatives, units, huge numbers); TOML
files are mutated templates and raw text. Each run exits 0 or exits 2 with one named-error line.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_harness import assert_clean, run_cli

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SMALL = ["--num-requests", "6", "--cost-model", "linear", "--no-progress", "--json"]
NUMBERS = st.sampled_from(("0", "1", "-1", "3", "16", "64", "1e-300", "1e300", "nan", "inf", "2.5",
                           "99999999999999999999", "0x10", "1_000", "", " ", "ten", "5ms", "-0"))
GARBAGE = st.text(max_size=12)
FLAGS = {
    "--rate": NUMBERS, "--max-num-seqs": NUMBERS, "--max-num-batched-tokens": NUMBERS,
    "--max-model-len": NUMBERS, "--block-size": NUMBERS, "--num-gpu-blocks": NUMBERS,
    "--long-prefill-token-threshold": NUMBERS, "--tp": NUMBERS, "--gpu-memory-utilization": NUMBERS,
    "--cv": NUMBERS, "--num-users": NUMBERS, "--max-tokens": NUMBERS, "--shared-prefix-len": NUMBERS,
    "--target-rate": NUMBERS, "--seed": NUMBERS,
    "--slo-ttft": st.sampled_from(("500ms", "0.5", "0", "-1", "1h", "ms", "nan", "1e400")),
    "--slo-tpot": st.sampled_from(("50ms", "0.05s", "-5ms", "x")),
    "--model": st.sampled_from(("llama-3.1-8b", "qwen2.5-0.5b", "gpt-17", "", "/no/such/config.json")),
    "--gpu": st.sampled_from(("h100", "l4", "tpu-v9", "")),
    "--policy": st.sampled_from(("vllm", "orca", "sarathi", "static", "vllm-v0", "fifo")),
    "--workload": st.sampled_from(("poisson", "gamma", "closed_loop", "sessions", "bursty")),
    "--lengths": st.sampled_from(("sharegpt", "arxiv", "nope", "sharegpt:lognormal", "sharegpt:cubic")),
    "--trace": st.sampled_from(("/no/such/trace.csv", "/dev/null", "/", "README.md")),
    "--trace-format": st.sampled_from(("azure", "mooncake", "generic", "csv")),
    "--config": st.sampled_from(("/no/such.toml", "/", "README.md", "/dev/null")),
    "--format": st.sampled_from(("csv", "parquet", "xlsx")),
}
SWITCHES = ("--no-chunked-prefill", "--no-prefix-caching", "--bogus", "-x")


@st.composite
def argv(draw) -> list[str]:
    flags = draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=4, unique=True))
    args = []
    for flag in flags:
        value = draw(st.one_of(FLAGS[flag], GARBAGE) if draw(st.integers(0, 9)) == 0 else FLAGS[flag])
        args += [flag, value] if draw(st.integers(0, 19)) else [flag]  # now and then a flag without its value
    args += draw(st.lists(st.sampled_from(SWITCHES), max_size=1))
    return args


@given(argv())
def test_fuzzed_run_arguments_run_or_name_the_error(args):
    code, _, err = run_cli("run", *args, *SMALL)
    assert_clean(code, err)


TEMPLATE = """seed = 0
[engine]
max_num_seqs = 8
max_num_batched_tokens = 2048
enable_prefix_caching = true
[deployment]
cost_model = "linear"
[workload]
kind = "poisson"
rate = 12.0
num_requests = 6
lengths = "sharegpt"
[slo]
ttft_s = 0.5
"""
TOML_VALUES = st.sampled_from(('"fast"', "true", '"false"', "1e-300", "nan", "-inf", "[1, 2]", "{a = 1}", "-0",
                               "1_000", '""', "0", "-1", "2024-01-01", "'yes'", '"""x"""', "0x10", "1e400"))


@st.composite
def mutated_toml(draw) -> str:
    lines = TEMPLATE.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        if "=" in lines[i]:
            key = lines[i].split("=")[0]
            lines[i] = f"{key}= {draw(st.one_of(TOML_VALUES, st.text(max_size=8)))}"
        else:
            lines[i] = draw(st.sampled_from(("", "[engine]", "[workload]", "[gpus]", "[slo", "kind =")))
    return "\n".join(lines) + "\n"


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(st.one_of(mutated_toml(), st.text(max_size=60), st.binary(max_size=60)))
def test_fuzzed_toml_files_run_or_name_the_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("toml") / "setup.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    code, _, err = run_cli("run", "--config", str(path), "--num-requests", "6", "--no-progress", "--json")
    assert_clean(code, err)
