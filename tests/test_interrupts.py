"""Interrupted work loses nothing: SIGINT or SIGTERM during `servesim run --out` or `servesim sweep`
leaves no half-written table a later load would take as complete, and a resumed sweep gives the same
table as an uninterrupted one."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim import SimulationConfig, simulate
from sim.api import table_io
from sim.api.results import Results

ROOT = Path(__file__).resolve().parent.parent
LINEAR = {"cost_model": "linear"}


def servesim(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "sim.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> bool:
    """True once `path` exists; False if the process ended first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    raise AssertionError(f"{path} never appeared")


def assert_complete_or_absent(out: Path, num_requests: int) -> None:
    """A folder is either loadable and whole, or has no summary.json (so load refuses it); no temp files."""
    assert not list(out.glob(".*.tmp")), list(out.iterdir())
    if (out / "summary.json").exists():
        assert len(Results.load(out).requests) == num_requests
    else:
        with pytest.raises(FileNotFoundError):
            Results.load(out)


def test_a_signal_while_run_writes_its_tables_leaves_no_half_table(tmp_path, sig=signal.SIGINT):
    out = tmp_path / "run"
    proc = servesim("run", "--num-requests", "500", "--rate", "50", "--cost-model", "linear", "--out", str(out),
                    "--format", "csv", "--plot-format", "none", "--no-progress")
    if wait_for(out, proc):  # the tables are being written now
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err
    assert_complete_or_absent(out, 500)


def test_an_interrupted_save_over_an_old_run_is_not_read_as_either(tmp_path, monkeypatch):
    config = SimulationConfig().replace(deployment=LINEAR, workload={"num_requests": 20})
    results = simulate(config)
    results.save(tmp_path, "csv")
    written = []

    def interrupted(df, path, fmt):
        if written:
            raise KeyboardInterrupt
        written.append(path)
        original(df, path, fmt)

    original = table_io.write_table
    monkeypatch.setattr("sim.api.results.write_table", interrupted)
    with pytest.raises(KeyboardInterrupt):
        simulate(config.replace(seed=1)).save(tmp_path, "csv")
    assert_complete_or_absent(tmp_path, 20)
    assert not (tmp_path / "summary.json").exists()  # new requests table, old steps: not a run


SWEEP = """seed = 0
[deployment]
cost_model = "linear"
[workload]
num_requests = 10
[sweep]
seeds = [0, 1]
rate = [2, 32]
engine.max_num_seqs = [4, 64]
"""


def test_a_resumed_sweep_gives_the_uninterrupted_table(tmp_path, sig=signal.SIGTERM):
    config = tmp_path / "sweep.toml"
    config.write_text(SWEEP)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert servesim("sweep", "--config", str(config), "--out", str(whole), "--executor", "serial",
                    "--no-progress").wait(timeout=300) == 0
    proc = servesim("sweep", "--config", str(config), "--out", str(cut), "--executor", "serial", "--no-progress")
    results = cut / "results"
    while proc.poll() is None and len(list(results.glob("*.json"))) < 2:
        time.sleep(0.01)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 130) and "Traceback" not in err, err
    assert not list(results.glob("*.tmp")) and not list(cut.glob(".*.tmp"))
    if proc.returncode == 130:
        assert not (cut / "sweep.csv").exists()
    assert servesim("sweep", "--config", str(config), "--out", str(cut), "--executor", "serial",
                    "--no-progress").wait(timeout=300) == 0
    assert (cut / "sweep.csv").read_bytes() == (whole / "sweep.csv").read_bytes()
