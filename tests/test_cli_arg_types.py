"""Token counts on the command line as vLLM's CLI takes them (k decimal, K binary)."""
import argparse

import pytest
from hypothesis import given, strategies as st

from sim.cli.arg_types import human_int
from sim.cli.main import main


@pytest.mark.parametrize("text,value", [("4096", 4096), ("8k", 8000), ("25.6k", 25600), ("32K", 32768),
                                        ("1M", 2**20), ("2m", 2_000_000), (" 16K ", 16384)])
def test_suffixes_read_as_vllm_reads_them(text, value):
    assert human_int(text) == value


@pytest.mark.parametrize("text", ["1.5K", "auto", "k", "8x", ""])
def test_anything_else_is_an_argument_error(text):
    with pytest.raises(argparse.ArgumentTypeError):
        human_int(text)


@given(st.integers(0, 10**6))
def test_plain_and_suffixed_integers_agree(n):
    assert human_int(str(n)) == n and human_int(f"{n}K") == 1024 * n and human_int(f"{n}k") == 1000 * n


def test_the_run_command_takes_them(capsys):
    assert main(["run", "--max-model-len", "32K", "--num-prompts", "3"]) == 0
    assert "Maximum concurrency for 32,768 tokens per request" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--max-model-len", "1.5K"])
    assert exit_.value.code == 2 and "--max-model-len: '1.5K'" in capsys.readouterr().err
