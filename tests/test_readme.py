"""The README's commands and Python snippets, run verbatim in the environment the README's first command
makes (`pip install -e .`: no dev extra, so no pyarrow).

Every `servesim ...` line must parse and build its config; the first command's output must be the one
the README shows; the Python snippets run as written. With SERVESIM_README=full (or the thorough
hypothesis profile) every command also runs, sweeps and capacity searches included (minutes).
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sim.cli.main import build_parser, main
from sim.cli.run import config_from_args

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)
FULL = os.environ.get("SERVESIM_README") == "full" or os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
WITHOUT_PYARROW = "import sys; sys.modules['pyarrow'] = None; "  # what `pip install -e .` leaves out


def commands() -> list[str]:
    """Every servesim invocation in the README's bash blocks, comments stripped, in order."""
    found = []
    for lang, body in BLOCKS:
        if lang != "bash":
            continue
        for line in body.splitlines():
            if "servesim " in line or line.rstrip().endswith("servesim"):
                command = "servesim" + line.split("servesim", 1)[1]
                found.append(command.split("  #")[0].split(" # ")[0].strip())
    return found


def python_snippets() -> list[str]:
    return [body for lang, body in BLOCKS if lang == "python"]


def test_the_readme_has_what_this_test_reads():
    assert commands()[0] == "servesim run" and len(commands()) >= 11
    assert len(python_snippets()) == 2


@pytest.mark.parametrize("command", commands())
def test_every_command_parses_and_builds_its_config(command, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = build_parser().parse_args(shlex.split(command)[1:])
    if args.command == "run":
        config_from_args(args)


def test_the_setup_toml_block_is_a_valid_config(tmp_path):
    from sim import SimulationConfig
    (toml,) = [body for lang, body in BLOCKS if lang == "toml"]
    path = tmp_path / "setup.toml"
    path.write_text(toml)
    config = SimulationConfig.from_toml(path)
    assert config.workload.rate == 12.0 and config.slo.tpot_s == 0.05


def test_the_first_command_prints_what_the_readme_shows(capsys):
    shown = next(body for lang, body in BLOCKS if lang == "" and body.startswith("llama-3.1-8b on 1x h100"))
    assert main(["run"]) == 0
    assert capsys.readouterr().out.strip() == shown.strip()


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run `code` as written, in `cwd`, with the project importable and pyarrow not."""
    (cwd / "snippet.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-c", WITHOUT_PYARROW + "exec(compile(open(sys.argv[1]).read(), "
                           "'README snippet', 'exec'))", str(cwd / "snippet.py")],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_python_snippet_runs_without_pyarrow(tmp_path):
    done = run_python(python_snippets()[0], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs" / "r12" / "requests.csv").exists() and (tmp_path / "cdf.png").exists()


def test_the_sweep_snippet_runs_on_a_sweep_csv(tmp_path):
    """The second snippet reads the sweep.csv `servesim sweep` writes; the CI run makes a small one
    with the example's axes (the full example sweep runs with SERVESIM_README=full)."""
    sweep = (ROOT / "examples" / "sweep.toml").read_text()
    if not FULL:
        sweep = sweep.replace("num_requests = 200", "num_requests = 15").replace("seeds = [0, 1, 2]", "seeds = [0, 1]")
        sweep = sweep.replace("rate = [5, 10, 20, 40]", "rate = [5, 20]")
    (tmp_path / "sweep.toml").write_text(sweep)
    assert main(["sweep", "--config", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "sweep-out"),
                 "--executor", "serial", "--no-progress"]) == 0
    done = run_python(python_snippets()[1], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "latency_vs_load.png").exists()


@pytest.mark.skipif(not FULL, reason="runs every README command in full (SERVESIM_README=full)")
def test_every_command_runs_verbatim(tmp_path):
    data = ROOT.parent / "shared" / "data"
    for command in commands():
        argv = shlex.split(command)[1:]
        if "--trace" in argv:
            found = sorted(data.rglob(argv[argv.index("--trace") + 1])) if data.is_dir() else []
            if not found:
                continue
            argv[argv.index("--trace") + 1] = str(found[0])
        if "--config" in argv:
            argv[argv.index("--config") + 1] = str(ROOT / argv[argv.index("--config") + 1])
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            assert main(argv) == 0, command
        finally:
            os.chdir(cwd)
