"""Where one simulation's Python work goes, counted in bytecodes per function: the same on every run.

CPU time on a shared machine drifts (the same tree measured 2x apart within a day), so small changes
to the loop cannot be judged by timing alone. This runs one `sim_speed.py` scenario under a tracer that
counts every bytecode the interpreter executes, per function, and prints the total and the largest
counts. The counts depend only on the code and the scenario, never on the machine; they weigh every
bytecode alike, so they do not see C work (numpy, dict internals) or the memory hierarchy: read them
beside a timing. A warm-up run of 50 requests comes first (imports and caches are not counted). The
tracer slows the run ~30x: a few hundred requests are enough.

    python benchmarks/opcode_counts.py [--scenario issue-2x] [--requests 600] [--mode fast|step] [--top 30]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sim_speed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def count_opcodes(scenario: str, num_requests: int, mode: str) -> collections.Counter:
    """Bytecodes executed per function ("path:name", paths relative to the project) in one run."""
    from kernels_cost_model import decode_stretch
    decode_stretch._FIXED.clear()  # (the priced-batch memo starts empty: earlier work in this process could
    sim_speed.run_once(scenario, 50, mode)  # fill it to its cap mid-count, and the counts would depend on it)
    counts: collections.Counter = collections.Counter()

    def on_call(frame, event, arg):
        frame.f_trace_opcodes = True
        code = frame.f_code
        key = f"{os.path.relpath(code.co_filename, ROOT)}:{code.co_name}"

        def on_opcode(frame, event, arg):
            if event == "opcode":
                counts[key] += 1
            return on_opcode
        return on_opcode

    sys.settrace(on_call)
    try:
        sim_speed.run_once(scenario, num_requests, mode)
    finally:
        sys.settrace(None)
    return counts


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="issue-2x", choices=sorted(sim_speed.SCENARIOS))
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--mode", default="fast", choices=("fast", "step"))
    parser.add_argument("--top", type=int, default=30)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    counts = count_opcodes(args.scenario, args.requests, args.mode)
    total = sum(counts.values())
    print(f"{args.scenario}, {args.requests:,} requests, {args.mode} mode: {total:,} bytecodes "
          f"({total / args.requests:,.0f} a request)")
    for key, count in counts.most_common(args.top):
        print(f"{count:>12,d} {100 * count / total:5.1f} %  {key}")


if __name__ == "__main__":
    main()
