"""Fuzz: the same config gives identical tables in a fresh process with another PYTHONHASHSEED.

A sample of fuzzed configs runs here and again in a subprocess (hash randomisation differs, so any
dependence on `hash()` of strings or bytes, set order or id() would show); the requests, steps and
tokens tables (or the error message) must match byte for byte.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_configs import TRACE_TEXT, configs
from fuzz_harness import TALLY

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
ROOT = Path(__file__).resolve().parent.parent
DIGEST_SCRIPT = """
import hashlib, json, sys, warnings
warnings.simplefilter("ignore")
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from test_fuzz_determinism import digest
print(json.dumps([digest(c) for c in json.load(sys.stdin)]))
"""


def digest(config: dict) -> str:
    """sha256 of a run's three tables as CSV text, or the error it raised."""
    from sim import SimulationConfig, simulate
    try:
        results = simulate(SimulationConfig.from_dict(config))
    except ValueError as exc:  # ConfigError, TraceFormatError: the message must match too
        return f"error: {exc}"
    text = "".join(t.to_csv(index=False) for t in (results.requests, results.steps, results.tokens()))
    return hashlib.sha256(text.encode()).hexdigest()


@settings(max_examples=max(1, settings.default.max_examples // 60))
@given(data=st.data())
def test_reruns_in_a_fresh_process_are_identical(tmp_path_factory, data):
    trace = tmp_path_factory.mktemp("trace") / "small.csv"
    trace.write_text(TRACE_TEXT)
    sample = data.draw(st.lists(configs(str(trace)), min_size=1, max_size=6))
    here = [digest(config) for config in sample]
    env = dict(os.environ, PYTHONHASHSEED=str(data.draw(st.integers(1, 2**32 - 1))))
    out = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT, str(ROOT), str(ROOT / "tests")],
                         input=json.dumps(sample), capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    there = json.loads(out.stdout)
    TALLY["reruns"] += len(sample)
    TALLY["nondeterministic_reruns"] += sum(a != b for a, b in zip(here, there))
    assert here == there
