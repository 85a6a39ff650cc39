"""Max sustainable rate: brackets the analytic capacity of a one-at-a-time server, stably."""
import math

import pytest

from sim import SimulationConfig
from sim.planning.capacity import (CapacityTarget, bracket_and_bisect, max_sustainable_rate, set_rate,
                          summarize_seeds)
from sim.core.cost import LinearCostModel
from kernels_cost_model.errors import ConfigError
import workloads as w

N, PROMPT, OUTPUT = 40, 256, 32


def constant_workload(rate):
    """Evenly spaced arrivals, fixed lengths: module level so it pickles."""
    return w.SyntheticWorkload(w.Constant(rate), w.Independent(w.Fixed(PROMPT), w.Fixed(OUTPUT)), N,
                               max_tokens=OUTPUT)


def service_times(m=LinearCostModel()):
    """(TTFT, service time) of one request alone: a whole-prompt step, then OUTPUT-1 decode steps."""
    first = m.fixed_s + (m.per_new_token_s + m.per_context_token_s) * PROMPT + m.per_sampled_s
    decodes = sum(m.fixed_s + m.per_new_token_s + m.per_sampled_s + m.per_context_token_s * (PROMPT + k)
                  for k in range(1, OUTPUT))
    return first, first + decodes


def analytic_capacity(ttft_bound):
    """Request k waits k*(S - 1/rate) once 1/rate < S; numpy's p99 of that line is at 0.99*(N-1)."""
    first, service = service_times()
    return 1.0 / (service - (ttft_bound - first) / (0.99 * (N - 1)))


@pytest.fixture(scope="module")
def config():
    return SimulationConfig.from_dict({
        "deployment": {"cost_model": "linear"},
        "engine": {"num_gpu_blocks": 512, "max_num_seqs": 1, "max_model_len": 2048, "enable_prefix_caching": False},
        "workload": {"rate": 1.0, "num_requests": N}})


def test_bisection_brackets_the_analytic_capacity_and_is_stable(config):
    first, service = service_times()
    bound = first + 0.5 * service
    target = CapacityTarget(ttft_p99_s=bound)
    runs = [max_sustainable_rate(config, target, seeds=[0, 1], workload=constant_workload, rel_tol=0.005)
            for _ in range(2)]
    truth = analytic_capacity(bound)
    for cap in runs:
        for _, row in cap.per_seed.iterrows():
            assert row["rate"] <= truth <= row["fail_rate"]
            assert row["fail_rate"] - row["rate"] <= 0.005 * row["fail_rate"]
        assert cap.low == cap.high == cap.rate          # deterministic arrivals: no spread across seeds
    assert runs[0].per_seed.equals(runs[1].per_seed)
    assert abs(runs[0].rate * service - 1) < 0.02       # ~ 1 / service time


def test_bracket_and_bisect_on_a_known_threshold():
    for threshold in (0.013, 3.7, 950.0):
        lo, hi = bracket_and_bisect(lambda r: r <= threshold, start=5.0, rel_tol=0.01, max_steps=20)
        assert lo <= threshold < hi and hi - lo <= 0.01 * hi
    assert bracket_and_bisect(lambda r: False, 1.0, max_steps=5) == (0.0, 1.0 / 32)
    assert bracket_and_bisect(lambda r: True, 1.0, max_steps=5) == (32.0, math.inf)


def test_bisection_stops_whatever_the_tolerance():
    calls = []
    for rel_tol in (0.0, -1.0):
        lo, hi = bracket_and_bisect(lambda r: calls.append(r) or r < 7.3, 5.0, rel_tol)
        assert lo < 7.3 <= hi and len(calls) < 100
        calls.clear()
    with pytest.raises(ConfigError) as err:
        max_sustainable_rate(SimulationConfig(), CapacityTarget(ttft_p99_s=1.0), rel_tol=math.nan)
    assert err.value.field == "rel_tol"


def test_spread_over_seeds_is_a_t_interval():
    cap = summarize_seeds([{"seed": s, "rate": r, "fail_rate": r + 1, "runs": []} for s, r in enumerate([9, 10, 11])])
    assert cap.rate == 10 and cap.low == pytest.approx(10 - 4.303 / math.sqrt(3)) and "± " in str(cap)


def test_target_checks_and_errors(config):
    summary = {"p99_ttft_ms": 900.0, "p99_tpot_ms": 40.0, "p99_e2el_ms": 5000.0, "slo_attainment": 0.95,
               "completed": 10, "num_requests": 11, "num_rejected": 1}
    assert CapacityTarget(ttft_p99_s=1.0, tpot_p99_s=0.05, min_attainment=0.9).holds(summary)
    assert not CapacityTarget(ttft_p99_s=0.8).holds(summary)
    assert not CapacityTarget(min_attainment=0.99).holds(summary)
    with pytest.raises(ConfigError):
        CapacityTarget()
    with pytest.raises(ConfigError) as err:
        set_rate(config, 0)
    assert err.value.field == "workload.rate"
    closed = config.replace(workload={"kind": "closed_loop", "num_users": 4})
    with pytest.raises(ConfigError) as err:
        set_rate(closed, 1.0)
    assert err.value.field == "workload.kind"


@pytest.mark.parametrize("kwargs, field", [
    (dict(seeds=3), "seeds"), (dict(seeds=[0, 0]), "seeds"), (dict(start_rate="5"), "start_rate"),
    (dict(max_steps=0), "max_steps"), (dict(max_steps=1.5), "max_steps"), (dict(replicas=1.5), "replicas"),
    (dict(router="nope"), "router"), (dict(workload=5), "workload"), (dict(target={"ttft_p99_s": 1.0}), "target"),
])
def test_max_sustainable_rate_names_a_bad_argument_before_any_run(kwargs, field):
    args = {"target": CapacityTarget(ttft_p99_s=1.0), **kwargs}
    with pytest.raises(ConfigError) as err:
        max_sustainable_rate(SimulationConfig(), args.pop("target"), **args)
    assert err.value.field == field
