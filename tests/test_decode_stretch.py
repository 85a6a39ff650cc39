"""The roofline model's closed-form decode stretch equals its step-by-step prices, bit for bit."""
from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import assume, given, settings, strategies as st

from kernels_cost_model.batch import BatchShape
from kernels_cost_model.builder import make_cost_model
from kernels_cost_model.decode_stretch import EXACT_BELOW, SEQUENTIAL_SUM, roofline_decode_times

SETUPS = [  # (model, gpu, tensor_parallel_size, async_scheduling): dense, MoE, TP, measured imbalance
    ("llama-2-7b", "a100-sxm-80gb", 1, True),
    ("llama-2-7b", "a100-sxm-80gb", 1, False),
    ("llama-3.1-70b", "h100-sxm", 4, True),
    ("mixtral-8x7b", "h100-sxm", 2, False),
    ("qwen3-30b-a3b", "h200", 1, True),
    ("qwen2.5-7b", "rtx-pro-6000", 1, True),
    ("qwen2.5-0.5b", "l4", 1, True),
]


def _model(setup):
    name, gpu, tp, async_ = setup
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_cost_model(name, gpu, tp, async_scheduling=async_)


MODELS = {setup: _model(setup) for setup in SETUPS}


@pytest.mark.skipif(not SEQUENTIAL_SUM, reason="this Python's sum compensates float rounding")
@settings(max_examples=60, deadline=None)
@given(setup=st.sampled_from(SETUPS), contexts=st.lists(st.integers(0, 40_000), min_size=1, max_size=300),
       first=st.integers(0, 50), count=st.integers(1, 80))
def test_stretch_equals_step_by_step(setup, contexts, first, count):
    model = MODELS[setup]
    n = len(contexts)
    got = roofline_decode_times(model, n, sum(contexts), max(contexts), first, count)
    want = [sum(model._terms(BatchShape([1] * n, [c + u for c in contexts], n)))  # the general path
            for u in range(first, first + count)]
    assert got == want


@pytest.mark.skipif(not SEQUENTIAL_SUM, reason="this Python's sum compensates float rounding")
@settings(max_examples=60, deadline=None)
@given(setup=st.sampled_from(SETUPS),
       rows=st.lists(st.tuples(st.sampled_from([1, 1, 1, 2, 17, 300]), st.integers(0, 40_000)),
                     min_size=1, max_size=200),
       unsampled=st.integers(0, 2))
def test_step_time_equals_its_general_path(setup, rows, unsampled):
    """step_time's pure-decode shortcut gives what the general pricing gives, for any batch."""
    model = MODELS[setup]
    batch = BatchShape([k for k, _ in rows], [c for _, c in rows], max(0, len(rows) - unsampled))
    assert model.step_time(batch) == sum(model._terms(batch))


def test_some_setup_has_a_measured_imbalance():
    """The imbalance branch is exercised (a GPU with measured decode imbalance is among the setups)."""
    assert any(model.decode_imbalance is not None for model in MODELS.values())


@settings(max_examples=40, deadline=None)
@given(setup=st.sampled_from(SETUPS),
       rows=st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 8000)), min_size=1, max_size=4),
       sampled=st.integers(0, 4))
def test_small_batches_priced_once_give_their_own_price(setup, rows, sampled):
    """A small batch's memoised price is its general path's, the second time too, and a model made
    from another by `dataclasses.replace` keeps a memo of its own."""
    import dataclasses
    model = MODELS[setup]
    batch = BatchShape([k for k, _ in rows], [c for _, c in rows], min(sampled, len(rows)))
    want = sum(model._terms(batch))
    assert model.step_time(batch) == want and model.step_time(batch) == want
    other = dataclasses.replace(model, async_scheduling=not model.async_scheduling)
    assert other.step_memo is not model.step_memo
    assert other.step_time(batch) == sum(other._terms(batch))


@given(k=st.integers(0, 2**40), delta=st.integers(-2, 2), b=st.integers(1, 4096), c=st.integers(1, 2048))
def test_integer_ceilings_of_the_quotients_are_the_float_ones(k, delta, b, c):
    """`_step_times` counts FA2's key blocks in integers: below EXACT_BELOW the float ceilings that
    `step_time` takes are the same (operands at and around multiples of the divisors)."""
    a = k * b * c + delta
    assume(0 <= a < EXACT_BELOW)
    assert math.ceil(a / b / c) == -(-a // (b * c))
    assert math.ceil(a / b) == -(-a // b)


@pytest.mark.skipif(not SEQUENTIAL_SUM, reason="this Python's sum compensates float rounding")
@pytest.mark.parametrize("contexts", [[2**60] + [1] * 7, [2**52, 3], [2**51 - 2]])
def test_figures_past_exact_integers_are_priced_in_floats(contexts):
    """Where the integer ceilings could part from the float ones (2**60 + 15 keys over 8 rows of 128
    a block: the float quotient rounds to 2**50), the stretch and the single step are priced as
    `step_time`'s general path prices them."""
    model = MODELS[("llama-2-7b", "a100-sxm-80gb", 1, True)]
    n = len(contexts)
    want = [sum(model._terms(BatchShape([1] * n, [c + u for c in contexts], n))) for u in range(3)]
    assert roofline_decode_times(model, n, sum(contexts), max(contexts), 0, 3) == want
    assert model.step_time(BatchShape([1] * n, contexts, n)) == want[0]
