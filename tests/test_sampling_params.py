"""SamplingParams validation: each error names the field and the value at fault."""
from __future__ import annotations

import pytest
from hypothesis import given

from sim import ConfigError, SamplingParams
from workloads.strategies import sampling_params


@pytest.mark.parametrize("kwargs, field, value", [
    ({"max_tokens": 0}, "max_tokens", 0),
    ({"max_tokens": -3}, "max_tokens", -3),
    ({"max_tokens": 2.0}, "max_tokens", 2.0),
    ({"max_tokens": True}, "max_tokens", True),
    ({"min_tokens": -1}, "min_tokens", -1),
    ({"max_tokens": 4, "min_tokens": 5}, "min_tokens", 5),
    ({"ignore_eos": 1}, "ignore_eos", 1),
    ({"ignore_eos": "yes"}, "ignore_eos", "yes"),
    ({"include_stop_str_in_output": 0}, "include_stop_str_in_output", 0),
])
def test_scalar_errors_name_field_and_value(kwargs, field, value):
    """Out-of-range or wrongly typed scalars raise ConfigError(field, value)."""
    with pytest.raises(ConfigError) as caught:
        SamplingParams(**kwargs)
    assert (caught.value.field, caught.value.value) == (field, value)
    assert field in str(caught.value) and repr(value) in str(caught.value)


@pytest.mark.parametrize("stop", [("",), ("ok", ""), (3,), ["ok", None]])
def test_bad_stop_strings_name_the_field(stop):
    """Empty or non-string stop entries are rejected, naming `stop` and the whole tuple."""
    with pytest.raises(ConfigError) as caught:
        SamplingParams(stop=stop)
    assert (caught.value.field, caught.value.value) == ("stop", tuple(stop))


@pytest.mark.parametrize("stop_token_ids", [(1, "2"), (True,), (1.0,), [None]])  # any int is valid, as in vLLM
def test_bad_stop_token_ids_name_the_field(stop_token_ids):
    """Stop ids must be integers >= 0 (bools are not ids)."""
    with pytest.raises(ConfigError) as caught:
        SamplingParams(stop_token_ids=stop_token_ids)
    assert (caught.value.field, caught.value.value) == ("stop_token_ids", tuple(stop_token_ids))


@pytest.mark.parametrize("field, value", [("stop", {"a"}), ("stop_token_ids", {1})])
def test_stop_collections_must_be_lists(field, value):
    """Sets (unordered) are rejected: the order of stop strings decides ties."""
    with pytest.raises(ConfigError) as caught:
        SamplingParams(**{field: value})
    assert (caught.value.field, caught.value.value) == (field, value)


def test_single_values_and_lists_normalise_to_tuples():
    """A bare string or id becomes a one-tuple; lists become tuples; None becomes empty."""
    params = SamplingParams(stop="###", stop_token_ids=7)
    assert (params.stop, params.stop_token_ids) == (("###",), (7,))
    params = SamplingParams(stop=["a", "b"], stop_token_ids=[1, 2])
    assert (params.stop, params.stop_token_ids) == (("a", "b"), (1, 2))
    assert SamplingParams(stop=None, stop_token_ids=None).stop == ()


def test_boundaries_are_accepted():
    """max_tokens=1 and min_tokens == max_tokens are valid."""
    assert SamplingParams(max_tokens=1, min_tokens=1).min_tokens == 1


def test_params_are_frozen_and_hashable():
    """SamplingParams is an immutable value."""
    params = SamplingParams(stop=["x"])
    with pytest.raises(AttributeError):
        params.max_tokens = 3
    assert hash(params) == hash(SamplingParams(stop=("x",)))


@given(sampling_params())
def test_generated_params_are_valid_values(params):
    """The public strategy only produces params that validate and round-trip."""
    assert 0 <= params.min_tokens <= params.max_tokens
    assert SamplingParams(params.max_tokens, params.min_tokens, params.ignore_eos,
                          params.stop_token_ids, params.stop,
                          params.include_stop_str_in_output) == params
