"""The commands, config blocks and Python snippets of docs/*.md, checked as tests/test_readme.py checks
the README's, so the pages cannot drift from the software.

- Every `servesim ...` (or `python -m sim.cli ...`) command, in a code block or inline, parses with the
  CLI's parser; a `run` command also builds its config and its cost model (catalog GPU, model and
  calibration names), and a config file under examples/ loads.
- Every `python benchmarks/<script>.py ...` command of the pages and the README names a script that
  exists, and its flags and values are known to that script's `build_parser()`. Nothing is run.
- Every `python -m <module>` names an importable module; `python -m pytest` paths match test files.
- A flag a page names alone (`--leave-gpu-out`, `--first-token prefill`) belongs to servesim or a benchmark;
  a `pip install -e ".[extra]"` names an extra of pyproject.toml.
- TOML blocks load as configs (a [search] block as a plan), the JSON GPU file as a GPU, and every
  `from X import Y` of a Python snippet resolves; reliability.md's error lines print as shown.

Inline commands are often mentions (`servesim run --trace`, `servesim calibrate --from-run`): for
those a missing required argument or a flag's missing value is fine, an unknown flag or a bad value
is not. Usage forms are read as a reader would: `[--fit]` is optional (checked), `fast|step` takes
its first choice, `--[no-]progress` is `--progress`, `N`/`NAME`/`DIR`/`S` and `<...>` are placeholders.
"""
from __future__ import annotations

import ast
import argparse
import importlib
import importlib.util
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from sim.cli.main import build_parser
from sim.cli.run import config_from_args
from tests.benchmark_loader import BENCHMARKS, load_benchmark

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md"))
PROJECT = {"sim", "policies", "workloads", "kernels_cost_model", "tests"}
PLACEHOLDERS = {"N": "2", "NAME": "h100", "DIR": "out-dir", "S": "busy"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str        # as the page writes it, comments and line continuations removed
    complete: bool   # a code block's command (all its required arguments given), not an inline mention

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def blocks(path: Path) -> list[tuple[str, str, int]]:
    """(language, body, line of the opening fence) of each fenced block."""
    text = path.read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def inline_spans(path: Path) -> list[tuple[str, int]]:
    """Backticked spans outside code blocks (they may wrap a line), whitespace collapsed, with their line."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    return [(" ".join(m.group(1).split()), text.count("\n", 0, m.start()) + 1)
            for m in re.finditer(r"`([^`]+)`", text)]


def block_lines(body: str, start: int) -> list[tuple[str, int]]:
    """A shell block's logical lines (continuations joined), comments removed, with their line."""
    found, pending, first = [], "", 0
    for offset, raw in enumerate(body.splitlines(), start=start + 1):
        line = raw.split("  #")[0].split(" # ")[0].rstrip()
        first = first or offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        found.append(((pending + line).strip(), first))
        pending, first = "", 0
    return [(line, n) for line, n in found if line]


def commands(pages: list[Path], pattern: str) -> list[Command]:
    """Commands containing `pattern` (a regex), from code blocks and inline spans, in page order."""
    found = []
    for path in pages:
        for lang, body, start in blocks(path):
            if lang not in ("", "bash", "sh", "shell"):
                continue
            for line, n in block_lines(body, start):
                m = re.match(r"(\w+=\S* )*" + pattern, line)   # after any VAR=value prefix
                if m:
                    found.append(Command(path.name, n, line[m.end(1) if m.group(1) else 0:], True))
        for span, n in inline_spans(path):
            if re.match(pattern, span):
                found.append(Command(path.name, n, span, False))
    return found


SERVESIM = r"(servesim |python -m sim\.cli )"
SERVESIM_COMMANDS = commands(PAGES, SERVESIM)
BENCHMARK_COMMANDS = commands(PAGES + [ROOT / "README.md"], r"(python )?benchmarks/\w+\.py\b") + [
    c for c in commands(PAGES, r"\w+\.py --")   # inline, the script's name alone: `sim_speed.py --requests 1000`
    if not c.complete and (BENCHMARKS / f"{c.text.split('.py')[0]}.py").is_file()]
MODULE_COMMANDS = [c for c in commands(PAGES, r"python -m (?!sim\.cli )") if "pytest" not in c.text]
PYTEST_COMMANDS = commands(PAGES, r"python -m pytest ")


def argv_of(text: str) -> list[str]:
    """The arguments a reader would type for a usage form."""
    text = re.sub(r"<[^>]*>", "placeholder", text).replace("--[no-]", "--").replace(" ...", "")
    text = re.sub(r"\[(-[^\]]*)\]", r"\1", text)     # [--fit], [--mode fast|step]: optional, but checked
    argv = []
    for token in shlex.split(text):
        if "|" in token and not token.startswith("{"):
            token = token.split("|")[0]
        argv.append(PLACEHOLDERS.get(token, token))
    return argv


def subparser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser the options of `argv` belong to (a subcommand's, where there is one)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and argv and argv[0] in action.choices:
            return subparser(action.choices[argv[0]], argv[1:])
    return parser


def relax(parser: argparse.ArgumentParser) -> None:
    """Required arguments become optional, in every subcommand too (an inline mention gives a few flags)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            action.required = False
            for sub in action.choices.values():
                relax(sub)
        elif action.option_strings or action.nargs is None:
            action.required = False
            if not action.option_strings:
                action.nargs = "?"


def parse(parser: argparse.ArgumentParser, argv: list[str], complete: bool, capsys) -> argparse.Namespace:
    """`argv` parsed; a mention may leave out required arguments and its last flag's value."""
    if not complete:
        relax(parser)
        last = subparser(parser, argv)._option_string_actions.get(argv[-1]) if argv else None
        if last is not None and last.nargs != 0:
            argv = argv[:-1]
    try:
        return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(capsys.readouterr().err.strip())


def test_the_pages_have_what_this_test_reads():
    assert len(PAGES) >= 12
    assert len([c for c in SERVESIM_COMMANDS if c.complete]) >= 13 and len(SERVESIM_COMMANDS) >= 30
    assert len({re.search(r"(\w+)\.py", c.text).group(1) for c in BENCHMARK_COMMANDS}) >= 20
    assert any("--baseline placeholder" in " ".join(argv_of(c.text)) for c in BENCHMARK_COMMANDS)


@pytest.mark.parametrize("command", SERVESIM_COMMANDS, ids=str)
def test_every_servesim_command_parses_and_builds_its_config(command, capsys, monkeypatch):
    from sim.api.cost_setup import build_cost_model
    from sim.cli.topology_flags import instance_shape
    monkeypatch.chdir(ROOT)
    argv = argv_of(re.sub(SERVESIM, "", command.text, count=1))
    for path in (a for a in argv if a.startswith("examples/")):
        assert (ROOT / path).is_file(), f"{command}: no {path}"
    args = parse(build_parser(), argv, command.complete, capsys)
    config = getattr(args, "config", None)
    config = config if config and (ROOT / config).is_file() else None
    if args.command == "run":
        args.config = config
        if getattr(args, "deployment_file", None) and not Path(args.deployment_file).is_file():
            args.deployment_file = None   # the file an earlier command of the page writes
        built = config_from_args(args)
        build_cost_model(built.deployment, built.engine, built.speculative_config)
        instance_shape(args)   # -pp, the CPU tier and their links
    elif config and args.command == "sweep":
        from sim.cli.capacity import load_sweep
        load_sweep(config)
    elif config and args.command == "capacity":
        from sim.planning.plan import Plan
        Plan.from_toml(config)
    elif config and args.command == "disagg":
        from sim.planning.disagg_config import load_disaggregated
        load_disaggregated(config)


def benchmark_parser(name: str) -> argparse.ArgumentParser:
    """benchmarks/<name>.py's parser, without running it; a skip where an optional package is missing."""
    try:
        module = load_benchmark(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in PROJECT | {p.stem for p in BENCHMARKS.glob("*.py")}:
            raise
        pytest.skip(f"benchmarks/{name}.py needs {exc.name}, not installed here")
    return module.build_parser()


@pytest.mark.parametrize("command", BENCHMARK_COMMANDS, ids=str)
def test_every_benchmark_command_names_a_script_and_flags_it_knows(command, capsys):
    script = re.search(r"(\w+)\.py", command.text)
    name, rest = script.group(1), command.text[script.end():]
    assert (BENCHMARKS / f"{name}.py").is_file(), f"{command}: no benchmarks/{name}.py"
    parse(benchmark_parser(name), argv_of(rest), False, capsys)


@pytest.mark.parametrize("command", MODULE_COMMANDS, ids=str)
def test_every_python_m_module_exists(command):
    module = command.text.split()[2]
    assert importlib.util.find_spec(module) is not None, f"{command}: no module {module}"


@pytest.mark.parametrize("command", PYTEST_COMMANDS, ids=str)
def test_every_pytest_command_names_test_files(command):
    paths = [a for a in shlex.split(command.text) if a.startswith("tests/")]
    assert paths and all(sorted(ROOT.glob(p)) for p in paths), command


def fenced(lang: str) -> list:
    """The pages' `lang` blocks as test parameters (page, body, line), each named page:line."""
    return [pytest.param(path.name, body, line, id=f"{path.name}:{line}")
            for path in PAGES for kind, body, line in blocks(path) if kind == lang]


@pytest.mark.parametrize("page,body,line", fenced("toml"))
def test_every_toml_block_loads(page, body, line):
    from sim import SimulationConfig
    from sim.planning.plan import Plan
    data = tomllib.loads(body)
    if "search" in data:   # a plan's [search] table, on the example plan of its kind
        plan = tomllib.loads((ROOT / "examples" / "topology_plan.toml").read_text())
        Plan.from_dict({**plan, "search": data["search"]}, root=ROOT / "examples")
    else:
        SimulationConfig.from_dict(data)


@pytest.mark.parametrize("page,body,line", fenced("json"))
def test_every_json_gpu_file_loads(page, body, line, tmp_path):
    from kernels_cost_model.hardware import gpu_from_file
    path = tmp_path / "my-gpu.json"
    path.write_text(body)
    assert gpu_from_file(str(path)).name == json.loads(body)["name"]


@pytest.mark.parametrize("page,body,line", fenced("python"))
def test_every_python_snippet_compiles_and_its_imports_resolve(page, body, line):
    tree = ast.parse(body, f"{page}:{line}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            missing = [a.name for a in node.names if a.name != "*" and not hasattr(module, a.name)
                       and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
            assert not missing, f"{page}:{line}: {node.module} has no {missing}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


def test_the_error_lines_reliability_shows_are_printed_as_shown(tmp_path, capsys, monkeypatch):
    """docs/reliability.md opens with five error lines: each input that makes one gives exactly that line."""
    from sim.cli.main import main
    (shown,) = [body for lang, body, _ in blocks(ROOT / "docs" / "reliability.md") if lang == "" and "error" in body]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rate.toml").write_text('[workload]\nrate = "fast"\n')
    (tmp_path / "caching.toml").write_text('[engine]\nenable_prefix_caching = "false"\n')
    (tmp_path / "cv.toml").write_text('[workload]\nkind = "poisson"\ncv = 2.0\n')
    (tmp_path / "traces").mkdir()
    rows = [f"2023-11-16 18:{15 + i // 600:02d}:{i % 600 / 10:04.1f},{-5 if i == 1207 else 100},20"
            for i in range(2, 1300)]   # row i on line i; line 1207 the bad one
    (tmp_path / "traces" / "azure.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    printed = []
    for argv in (["--config", "rate.toml"], ["--config", "caching.toml"], ["--config", "cv.toml"],
                 ["--trace", "traces/azure.csv", "--num-prompts", "2000"], ["--rate", "x"]):
        try:
            code = main(["run", *argv])
        except SystemExit as exc:   # (argparse's own errors)
            code = exc.code
        assert code == 2, argv
        printed.append(capsys.readouterr().err.strip().splitlines()[-1])
    assert printed == shown.strip().splitlines()


@pytest.mark.parametrize("command", commands(PAGES, r"pip install "), ids=str)
def test_every_pip_install_names_an_extra_the_project_has(command):
    """From a checkout, as the README installs: `pip install -e ".[ray]"` needs a `ray` extra."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    asked = re.fullmatch(r'pip install -e "\.\[([\w,]+)\]"', command.text)
    assert asked, f"{command}: install from the checkout, as the README does (pip install -e \".[extra]\")"
    assert set(asked.group(1).split(",")) <= set(extras), command


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every flag of `parser` and its subcommands."""
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= option_strings(sub)
    return found


def test_every_flag_a_page_names_alone_belongs_to_servesim_or_a_benchmark():
    """`--performance-mode interactivity`, `--leave-gpu-out`, `--first-token prefill`: prose names flags too."""
    known = option_strings(build_parser())
    for script in sorted(BENCHMARKS.glob("*.py")):
        try:
            known |= option_strings(benchmark_parser(script.stem))
        except pytest.skip.Exception:
            continue
    named = [(path.name, line, span) for path in PAGES for span, line in inline_spans(path)
             if re.fullmatch(r"--?[a-z][\w-]*(=\S+| \S+)?", span)]
    assert len(named) >= 50
    unknown = [f"{page}:{line}: {span}" for page, line, span in named if re.split(r"[= ]", span)[0] not in known]
    assert not unknown, unknown
