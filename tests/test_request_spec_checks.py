"""`RequestSpec` skips its field checks where the fields are the plain ones workloads build
(`RequestSpec._plainly_valid`): a spec is accepted, or refused with the same error, with or without it."""
from __future__ import annotations

from unittest.mock import patch

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim.core.sampling_params import SamplingParams
from sim.core.fields import MAX_ARRIVAL_S
from workloads.spec import RequestSpec

ODD = st.sampled_from([None, True, False, np.int64(3), np.float64(0.5), "", "a", 1e300, float("nan"),
                       float("inf"), -1, 0, 2, -0.0, 0.25, SamplingParams(), {"max_tokens": 4}, (5, 6)])


def outcome(fields: dict):
    """What building the spec gives: its fields, or the error's type and text."""
    try:
        spec = RequestSpec(prompt_token_ids=np.arange(4), **fields)
    except Exception as exc:  # noqa: BLE001 - any error must be the same either way
        return type(exc).__name__, str(exc)
    return repr([getattr(spec, name) for name in RequestSpec.__slots__ if name != "prompt_token_ids"])


#: per field, values of the plain kind, in range or just out of it (up to two fields then take odd ones)
PLAIN = {"arrival_time_s": st.floats(-1.0, 2 * MAX_ARRIVAL_S), "output_len": st.none() | st.integers(-1, 3),
         "sampling_params": st.just(SamplingParams(max_tokens=3)), "output_token_ids": st.none(),
         "request_id": st.sampled_from([None, "", "r"]), "priority": st.integers(-1, 2),
         "tenant": st.just("t"), "session_id": st.sampled_from([None, "s"]), "abort_time_s": st.none(),
         "return_hidden_states": st.booleans()}


@given(st.fixed_dictionaries(PLAIN), st.dictionaries(st.sampled_from(sorted(PLAIN)), ODD, max_size=2))
def test_a_spec_is_built_alike_with_or_without_the_shortcut(plain, odd):
    fields = {**plain, **odd}
    shortcut = outcome(fields)
    with patch.object(RequestSpec, "_plainly_valid", lambda self: False):
        assert outcome(fields) == shortcut


def test_the_workloads_specs_take_the_shortcut():
    spec = RequestSpec(0.5, np.arange(4), 3, SamplingParams(max_tokens=3), request_id="req-0", tenant="t")
    assert spec._plainly_valid()
