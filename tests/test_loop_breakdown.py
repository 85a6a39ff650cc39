"""benchmarks/loop_breakdown.py: its timers change no record, time every part they name and leave no
method wrapped behind them."""
import time

import pytest

from tests.benchmark_loader import load_benchmark


@pytest.mark.parametrize("scenario,mode", [("issue-light", "fast"), ("issue-2x", "step"), ("busy", "fast")])
def test_timed_run_has_the_records_of_an_untimed_one(scenario, mode, capsys):
    breakdown, sim_speed = load_benchmark("loop_breakdown"), load_benchmark("sim_speed")
    methods = {(owner, name): owner.__dict__.get(name)
               for _, owner, name in breakdown.PARTS + breakdown.ACROSS}
    plain = sim_speed.fingerprint(sim_speed.run_once(scenario, 150, mode)[1])
    with breakdown.Timers() as timers:
        start = time.perf_counter()
        total, records = sim_speed.run_once(scenario, 150, mode)
        wall = time.perf_counter() - start  # the timers' clock (`total` is CPU time: less on a busy machine)
    assert sim_speed.fingerprint(records) == plain
    assert {(owner, name): owner.__dict__.get(name) for owner, name in methods} == methods  # unwrapped
    top = [(owner, name) for label, owner, name in breakdown.PARTS if not label.startswith(" ")]
    plan, finish, leap = top[:3]
    assert timers.calls[plan] and timers.calls[finish]
    assert sum(timers.seconds[key] for key in top) <= wall
    # every leap attempt timed and classified in fast mode; none in step mode, nor where rows are lazy (the
    # issue's vLLM V0 setup under async scheduling: quiet turns are jumped instead)
    lazy = mode == "fast" and scenario.startswith("issue")
    assert sum(timers.outcomes.values()) == timers.calls[leap]
    assert bool(timers.calls[leap]) == (mode == "fast" and not lazy)
    assert bool(timers.calls[(breakdown.simulation, "jump")]) == lazy
    breakdown.report(timers, total, records, 150)
    out = capsys.readouterr().out
    assert "the rest (loop, SimPy, workload generation)" in out and "per row-step" in out
