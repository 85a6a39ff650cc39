"""Compare two conformance traces step by step, and shrink a disagreeing scenario."""
from __future__ import annotations

from collections.abc import Callable

from sim.fidelity.conformance.scenario import without_request


def first_difference(expected: dict, actual: dict) -> str | None:
    """A description of the first step (or finish) where `actual` departs from `expected`; None if
    they agree. Stop reasons are compared where `expected` has them (recordings since they were added)."""
    for i, (want, got) in enumerate(zip(expected["steps"], actual["steps"])):
        for key in ("tokens", "preempted", "admitted"):
            if want[key] != got[key]:
                return f"step {i} {key}: vLLM {want[key]} servesim {got[key]}"
    n_want, n_got = len(expected["steps"]), len(actual["steps"])
    if n_want != n_got:
        i = min(n_want, n_got)
        extra = (expected if n_want > n_got else actual)["steps"][i]
        return f"step {i}: only {'vLLM' if n_want > n_got else 'servesim'} has it: {extra}"
    if expected["finished"] != actual["finished"]:
        diff = {rid: (want, actual["finished"].get(rid)) for rid, want in expected["finished"].items()
                if actual["finished"].get(rid) != want}
        return f"finishes (vLLM, servesim): {diff}"
    if "stop_reasons" in expected and expected["stop_reasons"] != actual.get("stop_reasons"):
        return f"stop reasons: vLLM {expected['stop_reasons']} servesim {actual.get('stop_reasons')}"
    return None


def shrink(scenario: dict, disagrees: Callable[[dict], bool]) -> dict:
    """Drop requests one at a time while the scenario still disagrees (a smaller reproducer)."""
    changed = True
    while changed:
        changed = False
        for req in list(scenario["requests"]):
            smaller = without_request(scenario, req["id"])
            if smaller["requests"] and disagrees(smaller):
                scenario, changed = smaller, True
    return scenario
