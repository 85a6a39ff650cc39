"""The `servesim` command line: run, plot, report, calibrate, sweep, capacity, and any subcommand in COMMANDS.

To add a subcommand, write a module with `add_parser(subparsers)` that registers it and sets
`func=handler` (handler(args) -> exit code), and add that function to COMMANDS.
"""
from __future__ import annotations

import argparse
import difflib
import os
import signal
import sys
import threading
import traceback
from contextlib import contextmanager

from sim.cli.capacity import add_capacity_parser, add_sweep_parser
from sim.cli import calibrate, disagg, plot, report, run
from kernels_cost_model.errors import ConfigError
from sim.api.version import __version__

COMMANDS = [
    run.add_parser,
    plot.add_parser,
    calibrate.add_parser,
    add_sweep_parser,
    add_capacity_parser,
    report.add_parser,
    disagg.add_parser,
]

EPILOG = """\
exit codes:
  0  success
  1  unexpected failure (a bug: the traceback is printed; please report it)
  2  usage or configuration error; one line on stderr:
     servesim: error: <field>=<value>: <reason>

`servesim COMMAND --help` lists each command's options."""

USER_ERRORS = (ConfigError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
               FileExistsError)


class Parser(argparse.ArgumentParser):
    """argparse with servesim's error format: one line, `servesim: error: <what>: <reason>`, exit 2."""

    def error(self, message: str):
        command = " ".join(self.prog.split()[1:])
        hint = f" (see servesim {command + ' ' if command else ''}--help)"
        self.exit(2, f"servesim: error: {' '.join(message.split())}{hint}\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser with every subcommand of COMMANDS registered."""
    parser = Parser(
        prog="servesim", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Deterministic discrete-event simulator of a vLLM-style LLM serving engine.")
    parser.add_argument("--version", action="version", version=f"servesim {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(subparsers)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    from workloads.errors import TraceFormatError
    return USER_ERRORS + (TraceFormatError,)


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed arguments; an unknown flag is the subcommand's usage error (its --help, and the flag it
    resembles: `--requets-rate` -> `--request-rate`), not the top parser's."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = parser._subparsers._group_actions[0].choices[args.command]
        flags = [flag for action in command._actions for flag in action.option_strings]
        close = difflib.get_close_matches(extra[0].split("=")[0], flags, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if extra[0].startswith("-") and close else ""
        command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `servesim` console script; returns the exit code."""
    args = parse(build_parser(), argv)
    try:
        with terminate_as_interrupt():
            return args.func(args)
    except _user_errors() as exc:
        print(f"servesim: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `servesim run | head`: the reader left; the run itself succeeded
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("servesim: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's last resort: exit code 1, with the traceback
        traceback.print_exc()
        print(f"servesim: unexpected error: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return 1


@contextmanager
def terminate_as_interrupt():
    """While the block runs, SIGTERM interrupts like Ctrl-C, so pending writes clean up after themselves."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{exc.filename}: file not found"
    return " ".join(str(exc).split())


if __name__ == "__main__":
    raise SystemExit(main())
