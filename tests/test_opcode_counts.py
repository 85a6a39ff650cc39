"""benchmarks/opcode_counts.py: its counts of the project's functions are the run's own (the same
twice), name the engine's hot functions, and leave no tracer behind."""
import sys

from tests.benchmark_loader import load_benchmark


def test_counts_are_deterministic_and_name_the_step_functions():
    opcodes = load_benchmark("opcode_counts")
    tracer = sys.gettrace()  # (coverage or a debugger may hold one)
    first = opcodes.count_opcodes("issue-2x", 40, "step")
    assert sys.gettrace() is tracer
    again = opcodes.count_opcodes("issue-2x", 40, "step")
    ours = [key for key in first if key.split("/")[0] in ("sim", "policies", "kernels_cost_model", "workloads")]
    assert {key: first[key] for key in ours} == {key: again[key] for key in ours}  # (the library's caches warm)
    assert first["sim/engine/token_update.py:_apply_rows"] > 0 and first["sim/engine/engine.py:plan_step"] > 0
    assert "sim/engine/leap.py:leap" not in first  # the step mode never tries a leap
