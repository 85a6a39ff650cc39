"""Fuzz: trace files, byte by byte, through `servesim run --trace` and through `simulate()`.

Well-formed traces of every format are mutated (bytes replaced, inserted or cut; cells set to
garbage, negatives, NaN; rows reordered) or replaced by random bytes. A malformed line must reach
the user as `servesim: error: <file>:<line>: <reason>` with exit code 2 from the CLI and as a
TraceFormatError (or ConfigError) from `simulate()`; a readable trace must complete.
"""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_harness import TALLY, assert_clean, check_tables, run_cli
from kernels_cost_model.errors import ConfigError
from sim import SimulationConfig, simulate
from workloads.errors import TraceFormatError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TRACES = {
    "generic.csv": "arrival_s,prompt_tokens,output_tokens,session_id,tenant,priority,prefix_id,prefix_tokens\n"
                   "0.0,40,5,s1,a,0,p1,16\n0.25,300,9,,b,1,p1,16\n0.5,12,1,s1,a,0,,\n1.0,90,3,,,,,\n",
    "generic.jsonl": '{"arrival_s": 0, "prompt_tokens": 600, "output_tokens": 4, "hash_ids": [1, 2], "block_size": 512}\n'
                     '{"arrival_s": 0.5, "prompt_tokens": 30, "output_tokens": 2, "prefix_id": "x", "prefix_tokens": 8}\n',
    "azure.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,374,44\r\n"
                 "2023-11-16 18:17:04.0000000+00:00,90,12\r\n2023-11-16 18:17:05.5,1000,1\r\n",
    "mooncake.jsonl": '{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]}\n'
                      '{"timestamp": 1500, "input_length": 100, "output_length": 9, "hash_ids": [0]}\n',
    "burstgpt.csv": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,100,20,120,Conversation log\n6,GPT-4,50,0,50,Conversation log\n9,GPT-4,70,7,77,API log\n",
}
CELLS = (b"", b"-3", b"nan", b"inf", b"1e400", b"x", b"\x00", b"\xff\xfe", b"99999999999", b'"', b"{", b",,", b"\n",
         b"2023-13-45 99:99:99", b"[1, -2]", b"true", b"null", b"1.5")


@st.composite
def trace_bytes(draw) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(TRACES)))
    data = bytearray(TRACES[name].encode())
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(("insert", "replace", "cut", "swap_lines")))
        if action == "insert":
            data[at:at] = draw(st.sampled_from(CELLS))
        elif action == "replace":
            data[at:at + draw(st.integers(1, 6))] = draw(st.one_of(st.sampled_from(CELLS), st.binary(max_size=4)))
        elif action == "cut":
            del data[at:at + draw(st.integers(1, 20))]
        else:
            lines = bytes(data).split(b"\n")
            data = bytearray(b"\n".join([lines[0]] + list(reversed(lines[1:]))))
    if draw(st.integers(0, 9)) == 0:
        data = bytearray(draw(st.binary(max_size=80)))
    return name, bytes(data)


def _write(tmp_path_factory, name: str, data: bytes):
    path = tmp_path_factory.mktemp("trace") / name
    path.write_bytes(data)
    return path


@given(trace_bytes())
def test_fuzzed_traces_through_the_cli(tmp_path_factory, trace):
    path = _write(tmp_path_factory, *trace)
    code, _, err = run_cli("run", "--trace", str(path), "--num-requests", "8", "--cost-model", "linear",
                           "--no-progress", "--json")
    assert_clean(code, err)
    if code == 2 and path.name in err and "workload.path" not in err:
        assert re.search(re.escape(str(path)) + r":\d+: \S", err), err  # file:line: reason


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(trace_bytes(), st.sampled_from((None, "azure", "mooncake", "burstgpt", "generic")))
def test_fuzzed_traces_through_simulate(tmp_path_factory, trace, fmt):
    path = _write(tmp_path_factory, *trace)
    workload = {"kind": "trace", "path": str(path), "format": fmt, "num_requests": 8}
    config = SimulationConfig.from_dict({"workload": workload, "deployment": {"cost_model": "linear"},
                                         "engine": {"check_invariants": True}})
    TALLY["runs"] += 1
    try:
        results = simulate(config)
    except TraceFormatError as exc:
        assert exc.path == str(path) and exc.line >= 1 and str(exc).startswith(f"{path}:{exc.line}: ")
        TALLY["named_errors"] += 1
        return
    except ConfigError as exc:
        assert exc.field.startswith("workload.")
        TALLY["named_errors"] += 1
        return
    TALLY["completed"] += 1
    check_tables(results, None)
