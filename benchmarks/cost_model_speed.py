"""Microseconds per `step_time` call for typical batches (the engine calls it once per step).

    python benchmarks/cost_model_speed.py
"""
from __future__ import annotations

import argparse
import sys
import timeit
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels_cost_model import make_cost_model  # noqa: E402
from kernels_cost_model.batch import BatchShape  # noqa: E402


def batches() -> dict[str, BatchShape]:
    return {
        "256 decodes": BatchShape([1] * 256, [100 + 7 * i for i in range(256)], 256),
        "1 prefill chunk + 255 decodes": BatchShape([2048] + [1] * 255, [0] + [300 + i for i in range(255)], 255),
        "8 prefill chunks + 248 decodes": BatchShape([512] * 8 + [1] * 248, [64 * i for i in range(8)]
                                                     + [500] * 248, 250),
        "1 decode": BatchShape([1], [1000], 1),
        "worst: 256 prefills, distinct sizes": BatchShape([2 + i for i in range(256)], [0] * 256, 256),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    return argparse.ArgumentParser(description=__doc__.splitlines()[0])


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = {"llama-3.1-8b / h100": make_cost_model("llama-3.1-8b", "h100"),
                  "llama-3.1-70b / h100 x4": make_cost_model("llama-3.1-70b", "h100", 4),
                  "mixtral-8x7b / a100 x2": make_cost_model("mixtral-8x7b", "a100", 2)}
    for mname, cm in models.items():
        for bname, batch in batches().items():
            number = 20000
            best = min(timeit.repeat(lambda: cm.step_time(batch), number=number, repeat=5)) / number
            print(f"{mname:26s} {bname:36s} {best * 1e6:7.2f} us/call  (step {cm.step_time(batch) * 1e3:8.3f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
