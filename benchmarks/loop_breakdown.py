"""Where one simulation's CPU time goes: the engine loop's parts, and what became of the leap's attempts.

Runs one `sim_speed.py` scenario (10,000 requests of the issue setup at 20 req/s by default) with a timer
around each part listed in `PARTS` and prints, per part, its seconds (inclusive: a part's time holds the
parts below it), its share of the run, its calls and microseconds per call; then the per-row passes of
single steps per row-step, and the leap's attempts by outcome (fast mode). Nothing in the engine changes:
the timers wrap methods in this process only, and each timed call adds ~0.3 us (so the total is a little
above `sim_speed.py`'s). A warm-up run of 300 requests comes first (imports, caches).

    python benchmarks/loop_breakdown.py [--scenario issue-2x] [--requests 10000] [--mode fast|step]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sim_speed  # noqa: E402
from kernels_cost_model.cost_model import RooflineCostModel  # noqa: E402
from policies.base import Policy  # noqa: E402
from policies.vllm import VllmV1Policy  # noqa: E402
from sim.core.cost import LinearCostModel  # noqa: E402
from sim.core.kv_cache import KVCacheManager  # noqa: E402
from sim.engine.engine import Engine  # noqa: E402
from sim.engine.leap import Leaper  # noqa: E402
from sim.engine.leap_plan import StretchPlan  # noqa: E402
from sim.engine import simulation  # noqa: E402
from sim.engine.lazy_rows import LazyRows  # noqa: E402

#: (label, class, method), in print order; indented labels are parts of the one above
PARTS = [
    ("plan a step", Engine, "plan_step"),
    ("  policy: admit waiting requests", Policy, "admit_waiting"),
    ("  policy: decode pass (V0, Sarathi, Orca)", Policy, "decode_running"),
    ("  policy: running pass (V1)", VllmV1Policy, "schedule_running"),
    ("  engine: rows' lists and counters", Engine, "_rows_advanced"),
    ("  cost model: roofline step price", RooflineCostModel, "step_time"),
    ("  cost model: linear step price", LinearCostModel, "step_time"),
    ("finish a step", Engine, "finish_step"),
    ("  engine: token update of the rows", Engine, "_apply_rows"),
    ("  engine: retire finished requests", Engine, "_retire"),
    ("leap attempts", Leaper, "leap"),
    ("  is the engine at rest (checks, pass over the rows)", Leaper, "_steady_rows"),
    ("  the stretch's limits (tokens, KV, time)", StretchPlan, "fix_units"),
    ("  applying the stretch", StretchPlan, "apply"),
    ("    its KV moves", StretchPlan, "_replay_kv"),
    ("ending a stretch's tail", Leaper, "finish_tail"),
    ("quiet turns run back to back (lazy rows, vLLM V0)", simulation, "jump"),
    ("  lazy rows: the rows due at a plan", LazyRows, "_grow_due"),
    ("  lazy rows: a step's end with rows due", LazyRows, "end_step"),
    ("arrivals: add a request", Engine, "add_request"),
]
#: parts called from several of the above (timed inside them too)
ACROSS = [
    ("KV: allocate", KVCacheManager, "allocate"),
    ("KV: free", KVCacheManager, "free"),
    ("KV: register full blocks", KVCacheManager, "cache_full_blocks"),
]
#: the per-row passes of a single step (their time per row-step is printed apart)
ROW_PASSES = ("decode_running", "schedule_running", "_rows_advanced", "_apply_rows")


class Timers:
    """Seconds and calls per (class, method), and the leap's attempts by outcome."""

    def __init__(self):
        self.seconds = collections.Counter()
        self.calls = collections.Counter()
        self.outcomes = collections.Counter()
        self.originals = {}

    def __enter__(self) -> "Timers":
        """Wrap the parts' methods (and classify the leap's attempts) until the block ends."""
        for _, owner, name in PARTS + ACROSS + [("", Leaper, "leap")]:
            self.originals.setdefault((owner, name), owner.__dict__.get(name))  # None: inherited
        for _, owner, name in PARTS + ACROSS:
            setattr(owner, name, self._timed(owner, name, getattr(owner, name)))
        leap = Leaper.leap
        timers = self

        def classified(leaper, *args, **kwargs):
            cooling, watching = leaper.cooldown, leaper.watch is not None
            result = leap(leaper, *args, **kwargs)
            timers.outcomes[_outcome(leaper, result, cooling, watching)] += 1
            return result
        Leaper.leap = classified
        return self

    def __exit__(self, *exc) -> None:
        for (owner, name), method in self.originals.items():
            if method is None:
                delattr(owner, name)
            else:
                setattr(owner, name, method)
        self.originals.clear()

    def _timed(self, owner, name, method):
        key, seconds, calls, clock = (owner, name), self.seconds, self.calls, time.perf_counter

        def timed(*args, **kwargs):
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[key] += clock() - start
                calls[key] += 1
        return timed

    def clear(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.outcomes.clear()


def _outcome(leaper: Leaper, result, cooling: int, watching: bool) -> str:
    if cooling:
        return "skipped (backing off after misses)"
    if result is not None:
        return "leapt"
    if leaper.watch is not None:
        return "refused: a watched row near its length rule" if watching else "refused: a row near its length rule"
    if leaper.cooldown:
        return "refused: the pass over the rows or the stretch's limits"
    return "refused by the cheap checks (arrival due, waiting head may enter, ...)"


def report(timers: Timers, total: float, records, num_requests: int) -> None:
    print(f"total {total:.3f} CPU-s, {num_requests / total:,.0f} requests per CPU-s (timers included)")
    _print_parts(timers, PARTS, total)
    timed = sum(timers.seconds[(o, n)] for label, o, n in PARTS if not label.startswith(" "))
    rest = total - timed
    print(f"  {'the rest (loop, SimPy, workload generation)':54s} {rest:7.3f} s {rest / total:6.1%}")
    _print_parts(timers, ACROSS, total)
    row_steps = int(sum(records.steps.columns()["batch_size"]))
    passes = sum(timers.seconds[(o, n)] for _, o, n in PARTS if n in ROW_PASSES)
    print(f"rows: {row_steps:,d} row-steps in {len(records.steps):,d} steps; the single steps' per-row passes "
          f"{passes:.3f} s = {passes / max(row_steps, 1) * 1e6:.2f} us per row-step of the whole run")
    if timers.outcomes:
        print("leap attempts:", ", ".join(f"{k}: {v:,d}" for k, v in timers.outcomes.most_common()))


def _print_parts(timers: Timers, parts: list, total: float) -> None:
    for label, owner, name in parts:
        key = (owner, name)
        if timers.calls[key]:
            seconds, calls = timers.seconds[key], timers.calls[key]
            print(f"  {label:54s} {seconds:7.3f} s {seconds / total:6.1%} {calls:9,d} calls "
                  f"{seconds / calls * 1e6:8.1f} us")


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="issue-2x", choices=sorted(sim_speed.SCENARIOS))
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--mode", default="fast", choices=("fast", "step"))
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    with Timers() as timers:
        sim_speed.run_once(args.scenario, 300, args.mode)
        timers.clear()
        total, records = sim_speed.run_once(args.scenario, args.requests, args.mode)
    print(f"{args.scenario}, {args.requests:,d} requests, {args.mode} mode")
    report(timers, total, records, args.requests)


if __name__ == "__main__":
    main()
