"""Synthetic open-loop workloads and mixes: the one-liner, determinism, cost."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.errors import ConfigError
from workloads import (Constant, Fixed, Independent, Mix, OpenLoopWorkload, SyntheticWorkload, Uniform,
                       gamma_workload, is_closed_loop, make_rng, poisson_workload, workload_class)


def same_specs(a, b):
    fields = ("arrival_time_s", "output_len", "sampling_params", "request_id", "priority", "tenant", "session_id")
    return len(a) == len(b) and all(
        np.array_equal(x.prompt_token_ids, y.prompt_token_ids) and all(getattr(x, f) == getattr(y, f) for f in fields)
        for x, y in zip(a, b))


def test_sharegpt_poisson_one_liner():
    workload = poisson_workload(rate=10, num_requests=1000, lengths="sharegpt")
    assert isinstance(workload, OpenLoopWorkload) and not is_closed_loop(workload)
    specs = list(workload.iter_requests(make_rng(0, "workload")))
    times = np.array([s.arrival_time_s for s in specs])
    assert [s.request_id for s in specs[:3]] == ["req-0", "req-1", "req-2"] and len(specs) == 1000
    assert np.all(np.diff(times) >= 0) and 1000 / times[-1] == pytest.approx(10, rel=0.1)
    assert np.mean([s.num_prompt_tokens for s in specs]) == pytest.approx(2340, rel=0.1)
    assert all(s.sampling_params.max_tokens == s.output_len and s.sampling_params.ignore_eos for s in specs)
    assert all(s.prompt_token_ids.dtype == np.int32 for s in specs)


@given(seed=st.integers(0, 2**32), rate=st.floats(0.1, 100), cv=st.floats(0.5, 3))
def test_same_seed_same_requests(seed, rate, cv):
    workload = gamma_workload(rate, cv, num_requests=20, lengths="arxiv", shared_prefix_len=16)
    first = list(workload.iter_requests(make_rng(seed, "w")))
    assert same_specs(first, list(workload.iter_requests(make_rng(seed, "w"))))
    assert not same_specs(first, list(workload.iter_requests(make_rng(seed + 1, "w"))))


def test_shared_prefix_and_caps():
    workload = SyntheticWorkload(Constant(1.0), Independent(Uniform(10, 50), Fixed(9)), num_requests=50,
                                 shared_prefix_len=32, max_tokens=4, ignore_eos=False, priority=2, tenant="t")
    specs = list(workload.iter_requests(make_rng(2)))
    longest = max(specs, key=lambda s: s.num_prompt_tokens)
    for s in specs:
        n = min(32, s.num_prompt_tokens)
        assert np.array_equal(s.prompt_token_ids[:n], longest.prompt_token_ids[:n])
        assert (s.sampling_params.max_tokens, s.sampling_params.ignore_eos, s.output_len) == (4, False, 9)
        assert (s.priority, s.tenant) == (2, "t")
    assert [s.arrival_time_s for s in specs[:3]] == [1.0, 2.0, 3.0]


def test_duration_mode():
    specs = list(poisson_workload(20, duration_s=30.0, lengths="azure_code").iter_requests(make_rng(3)))
    assert len(specs) == pytest.approx(600, rel=0.2) and specs[-1].arrival_time_s < 30.0


@pytest.mark.parametrize("build, field", [
    (lambda: poisson_workload(0, 10), "rate"), (lambda: poisson_workload(-2.0, 10), "rate"),
    (lambda: poisson_workload(1, 10, lengths="unknown"), "lengths"),
    (lambda: poisson_workload(1, 10, duration_s=5.0), "num_requests/duration_s"),
    (lambda: poisson_workload(1, 10, max_tokens=0), "max_tokens"),
    (lambda: workload_class("chat", 1, num_requests=3, ttft_slo_s=0), "chat.ttft_slo_s"),
])
def test_bad_workload_parameters(build, field):
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.field == field


def test_mix_merges_classes_with_slos_and_priorities():
    mix = Mix([workload_class("chat", 8, "sharegpt", duration_s=20, priority=0, ttft_slo_s=0.5, tpot_slo_s=0.05),
               workload_class("batch", 2, "arxiv", duration_s=20, priority=1)])
    specs = list(mix.iter_requests(make_rng(4, "mix")))
    times = [s.arrival_time_s for s in specs]
    assert times == sorted(times) and [s.request_id for s in specs] == [f"req-{i}" for i in range(len(specs))]
    tenants = {t: [s for s in specs if s.tenant == t] for t in ("chat", "batch")}
    assert len(tenants["chat"]) == pytest.approx(160, rel=0.25) and len(tenants["batch"]) == pytest.approx(40, rel=0.4)
    assert {s.priority for s in tenants["batch"]} == {1}
    assert mix.slos()["chat"] == {"ttft_slo_s": 0.5, "tpot_slo_s": 0.05}
    assert same_specs(specs, list(mix.iter_requests(make_rng(4, "mix"))))
    with pytest.raises(ConfigError, match="unique"):
        Mix([workload_class("a", 1, num_requests=1), workload_class("a", 1, num_requests=1)])


@pytest.mark.parametrize("kwargs, field, value", [
    (dict(num_requests=True), "num_requests", True),
    (dict(num_requests="5"), "num_requests", "5"),
    (dict(num_requests=10**12), "num_requests", 10**12),
    (dict(num_requests=3, shared_prefix_len=1.5), "shared_prefix_len", 1.5),
    (dict(num_requests=3, tenant=5), "tenant", 5),
    (dict(num_requests=3, lengths=Fixed(5)), "lengths", Fixed(5)),
])
def test_synthetic_workload_names_a_bad_argument_at_construction(kwargs, field, value):
    with pytest.raises(ConfigError) as err:
        SyntheticWorkload(Constant(5.0), **{"lengths": "sharegpt", **kwargs})
    assert err.value.field == field and err.value.value == value


def test_a_bool_is_not_a_rate_and_a_lone_distribution_is_not_a_pair():
    with pytest.raises(ConfigError, match=r"rate=True: must be a finite number > 0"):
        SyntheticWorkload(Constant(True), "sharegpt", num_requests=3)
    with pytest.raises(ConfigError, match=r"prompt=5: must be a length distribution"):
        Independent(5, Fixed(5))
    with pytest.raises(ConfigError, match=r"classes\[0\]=5: must be a WorkloadClass"):
        Mix([5])
