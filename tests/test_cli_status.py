"""Small things a user meets: what stderr says while outputs are written, help texts, .gitignore."""
from pathlib import Path

import pytest

from sim.cli.main import main

FAST = ["--num-prompts", "20", "--request-rate", "20"]
ROOT = Path(__file__).resolve().parent.parent


def test_status_lines_while_writing_outputs_only_when_progress_shows(capsys, tmp_path):
    assert main(["run", *FAST, "--out", str(tmp_path / "a"), "--table-format", "csv", "--progress"]) == 0
    err = capsys.readouterr().err
    assert "writing csv tables to" in err and "writing plots to" in err
    assert err.rstrip().splitlines()[-1].startswith("wrote")
    assert main(["run", *FAST, "--out", str(tmp_path / "b"), "--table-format", "csv"]) == 0  # stderr not a tty
    err = capsys.readouterr().err
    assert "writing" not in err and err.startswith("wrote csv tables")


@pytest.mark.parametrize("command, words", [
    ("sweep", "Run a grid (or list) of configurations x seeds"),
    ("capacity", "Rank deployments (GPU x tensor parallelism"),
    ("report", "self-contained HTML page"),
])
def test_every_subcommand_help_has_a_description(capsys, command, words):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert words in " ".join(capsys.readouterr().out.split())


def test_run_help_names_table_and_image_formats_apart(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "--table-format" in out and "--plot-format" in out and "--tensor-parallel-size" in out


def test_default_output_folders_are_ignored_by_git():
    ignored = (ROOT / ".gitignore").read_text().split()
    assert {"runs/", "sweep-out/", "capacity-out/"} <= set(ignored)


def test_every_output_folder_and_figure_the_readme_and_examples_write_is_ignored_by_git():
    import re
    ignored = set((ROOT / ".gitignore").read_text().split())
    texts = [(ROOT / "README.md").read_text()] + [p.read_text() for p in (ROOT / "examples").glob("*.toml")]
    folders = {m.split("/")[0] for t in texts for m in re.findall(r"--(?:out|result-dir) ([\w./-]+)", t)
               if "." not in m and not m.isupper()}  # DIR: a placeholder
    figures = {m for t in texts for m in re.findall(r'savefig\("([^"/]+)"\)', t)}
    assert folders and figures
    assert {f"{f}/" for f in folders} <= ignored and {f"/{f}" for f in figures} <= ignored
