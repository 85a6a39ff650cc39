"""The fuzz campaign's shared pieces: run the CLI on fuzzed input, judge the outcome, tally the figures.

Every run must end one of two ways: exit code 2 with exactly one `servesim: error: <what>: <reason>`
line on stderr and no traceback, or exit code 0 with a run whose invariants held every step (the
configs turn `engine.check_invariants` on), every request finished and all KV blocks free at the end
(`run_engine` raises InvariantError otherwise, which would surface here as exit code 1).

With FUZZ_REPORT=path set, the tally (runs, completed, named errors, tracebacks, invariant
violations, lost requests, nondeterministic reruns, hangs) is written there as JSON at exit.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import re
import signal
from collections import Counter

from sim.cli import main

ERROR_LINE = re.compile(r"^servesim: error: \S.*: \S.*$")
HANG_SECONDS = 300
"""A run of these sizes takes well under a second; one still going after five minutes is a hang."""
TALLY: Counter = Counter()


class Hang(BaseException):
    """A single fuzz run took longer than HANG_SECONDS (a BaseException, so the CLI does not catch it)."""


@contextlib.contextmanager
def deadline(seconds: int = HANG_SECONDS):
    """Raise Hang if the block runs longer than `seconds` (SIGALRM; main thread only)."""
    def expire(signum, frame):
        raise Hang(f"no result after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(*argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `servesim *argv` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    TALLY["runs"] += 1
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), deadline():
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse: usage errors and --help
                code = exc.code if isinstance(exc.code, int) else 2
    except Hang:
        TALLY["hangs"] += 1
        raise
    return code, out.getvalue(), err.getvalue()


def assert_clean(code: int, err: str) -> None:
    """Exit 0, or exit 2 with one named-error line; never a traceback."""
    if "Traceback" in err or code not in (0, 2):
        TALLY["tracebacks"] += 1
        if "InvariantError" in err:
            TALLY["invariant_violations"] += 1
        if "never finished" in err or "still held" in err:
            TALLY["lost_requests"] += 1
        raise AssertionError(f"exit code {code}, stderr:\n{err}")
    if code == 2:
        errors = [line for line in err.splitlines() if line.startswith("servesim: error:")]
        others = [line for line in err.splitlines()
                  if line and not line.startswith(("servesim: error:", "servesim: warning:"))]
        assert len(errors) == 1 and ERROR_LINE.match(errors[0]), err
        assert not others, err
        TALLY["named_errors"] += 1
    else:
        TALLY["completed"] += 1


def check_tables(results, expected: int | None) -> None:
    """A completed run lost no request: every one is finished (and there are `expected`, if known)."""
    requests = results.requests
    lost = int(requests["finish_reason"].isna().sum())
    if lost or (expected is not None and len(requests) != expected):
        TALLY["lost_requests"] += 1
        raise AssertionError(f"{lost} unfinished requests; {len(requests)} rows, {expected} expected")


def toml_text(config: dict) -> str:
    """A TOML document for a dict of scalars and one level of tables (None values are left out)."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in config.items()
             if not isinstance(value, dict) and value is not None]
    for section, table in config.items():
        if isinstance(table, dict):
            lines.append(f"[{section}]")
            lines += [f"{key} = {_toml_value(value)}" for key, value in table.items() if value is not None]
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {float("inf"): "inf", float("-inf"): "-inf"}.get(value, "nan" if value != value else repr(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def _write_report() -> None:
    path = os.environ.get("FUZZ_REPORT")
    if path and TALLY:
        figures = {key: TALLY.get(key, 0) for key in
                   ("runs", "completed", "named_errors", "tracebacks", "invariant_violations",
                    "lost_requests", "reruns", "nondeterministic_reruns", "hangs")}
        with open(path, "w") as f:
            json.dump(figures, f, indent=2)


atexit.register(_write_report)
