"""How far a request's output can grow before the engine must look at a token to know whether it stops.

The engine's stop check skips a token that is not among the request's stop candidates when the length
rule does not bind on it (`stop_candidates`). For a synthetic stream that test needs no token: the
tokens are filler ids except the EOS id at a known position. So the request carries `quiet_until`,
the first output position at which the skip is not known to hold. Below it `Engine._apply_rows` skips
the test; from it on, the test runs as before and `quiet_until` moves on. A stream whose tokens are
not known in closed form (scripted, or a stop id among the filler ids) gets -1: the test runs on
every token, as it did before this shortcut.
"""
from __future__ import annotations

from workloads.token_streams import FILLER_RANGE

ALWAYS_CHECK = -1  # `quiet_until` of a request whose every token is tested
NEVER = 1 << 62


def quiet_until(stream, quick: tuple | None, start: int) -> int:
    """The first output position >= `start` whose token the stop test must see, for a request on
    `stream` with stop candidates `quick` ((stop ids, output count where a length rule binds), or None
    with stop strings); ALWAYS_CHECK where that is not known in closed form."""
    synthetic = getattr(stream, "synthetic", None)
    if quick is None or synthetic is None:
        return ALWAYS_CHECK
    stop_ids, limit = quick
    if any(token in FILLER_RANGE for token in stop_ids):
        return ALWAYS_CHECK
    _, eos_position, eos_id = synthetic
    first = eos_position if eos_id in stop_ids and eos_position >= start else NEVER
    return max(start, min(first, limit - 1))  # a token at position p with p + 1 >= limit is tested
