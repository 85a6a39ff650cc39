"""`quiet_until`: below it no token of a synthetic stream can stop its request, and it is the first
position from `start` at which one could (the engine's stop test skips the positions below it)."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim.engine.quiet import ALWAYS_CHECK, NEVER, quiet_until
from workloads.spec import RequestSpec
from workloads.token_streams import FILLER_BASE_TOKEN_ID, stream_for

EOS = 2


def _skips(stream, quick, position: int) -> bool:
    """The engine's stop test lets the token at `position` pass (`Engine._apply_rows`)."""
    stop_ids, limit = quick
    return stream(position) not in stop_ids and position + 1 < limit


@given(output_len=st.one_of(st.none(), st.integers(1, 200)), index=st.integers(0, 10**5),
       start=st.integers(0, 250), limit=st.integers(1, 300),
       stop_ids=st.sets(st.sampled_from([EOS, 7, 99, FILLER_BASE_TOKEN_ID + 3]), max_size=3))
def test_quiet_positions_are_exactly_the_ones_the_stop_test_skips(output_len, index, start, limit, stop_ids):
    stream = stream_for(RequestSpec(0.0, np.arange(4, dtype=np.int32) + 5, output_len=output_len), index, EOS)
    quick = (frozenset(stop_ids), limit)
    quiet = quiet_until(stream, quick, start)
    if FILLER_BASE_TOKEN_ID + 3 in stop_ids:
        assert quiet == ALWAYS_CHECK  # a filler id may stop it: tokens must be read
        return
    assert quiet >= start
    assert all(_skips(stream, quick, p) for p in range(start, min(quiet, start + 300)))
    if quiet < NEVER:
        assert not _skips(stream, quick, quiet)  # the first position the test must see


def test_scripted_streams_and_stop_strings_are_always_checked():
    prompt = np.arange(4, dtype=np.int32) + 5
    scripted = stream_for(RequestSpec(0.0, prompt, output_token_ids=[9, 9, EOS]), 0, EOS)
    synthetic = stream_for(RequestSpec(0.0, prompt, output_len=10), 0, EOS)
    assert quiet_until(scripted, (frozenset({EOS}), 50), 0) == ALWAYS_CHECK
    assert quiet_until(synthetic, None, 0) == ALWAYS_CHECK  # stop strings: no candidates known
    assert quiet_until(synthetic, (frozenset({EOS}), 50), 0) == 9      # its EOS position
    assert quiet_until(synthetic, (frozenset(), 50), 0) == 49          # ignore_eos: the length rule
    assert quiet_until(synthetic, (frozenset({EOS}), 50), 12) == 49    # past its EOS
