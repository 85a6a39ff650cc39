"""Multi-replica clusters and routers."""
import pytest

from sim import SimulationConfig, simulate
from sim.planning.cluster import simulate_cluster
from kernels_cost_model.errors import ConfigError
from sim.planning.routers import ROUTERS


@pytest.fixture(scope="module")
def sessions():
    return SimulationConfig.from_dict({
        "deployment": {"cost_model": "linear"}, "engine": {"num_gpu_blocks": 4000},
        "workload": {"kind": "sessions", "rate": 2.0, "num_requests": 40}})


@pytest.fixture(scope="module")
def by_router(sessions):
    return {r: simulate_cluster(sessions, 4, r) for r in ROUTERS}


def test_prefix_affinity_beats_round_robin_on_multi_turn_chat(by_router):
    hit = {r: out.summary["prefix_cache_hit_rate"] for r, out in by_router.items()}
    assert hit["prefix_affinity"] > hit["round_robin"] + 0.2
    turns = by_router["prefix_affinity"].results.requests.groupby("session_id")["replica"].nunique()
    assert (turns == 1).all()                           # every session stays on one replica


def test_every_request_is_served_once_and_tables_add_up(by_router):
    for out in by_router.values():
        n = out.summary["num_requests"]
        assert n == sum(r.summary["num_requests"] for r in out.replicas)
        assert out.results.requests["request_id"].is_unique and out.summary["completed"] == n
        assert out.results.requests["arrival_time"].is_monotonic_increasing
        assert len(out.per_replica()) == 4


def test_round_robin_spreads_evenly_and_one_replica_equals_simulate(sessions):
    out = simulate_cluster(sessions, 3, "round_robin")
    counts = out.results.requests["replica"].value_counts()
    assert counts.max() - counts.min() <= 1
    one = simulate_cluster(sessions, 1)
    assert one.replicas[0].summary == simulate(sessions).summary


def test_heterogeneous_replicas_and_errors(sessions):
    out = simulate_cluster(sessions, [{"gpu": "h100"}, {"gpu": "a100"}], "least_outstanding")
    assert out.summary["completed"] == out.summary["num_requests"]
    with pytest.raises(ConfigError) as err:
        simulate_cluster(sessions, 2, "random")
    assert err.value.field == "router"
    with pytest.raises(ConfigError):
        simulate_cluster(sessions, 0)


def test_cluster_is_deterministic(sessions):
    a = simulate_cluster(sessions, 3, "least_kv").summary
    b = simulate_cluster(sessions, 3, "least_kv").summary
    assert a == b


def test_replicas_speculate_as_simulate_does():
    spec = {"method": "eagle3", "num_speculative_tokens": 3}
    config = SimulationConfig().replace(workload={"num_requests": 20}, speculative_config=spec)
    alone = simulate(config).summary
    one = simulate_cluster(config, 1).summary
    assert one["mean_tpot_ms"] == alone["mean_tpot_ms"] and one["spec_decode_num_draft_tokens"] > 0
    assert one["mean_tpot_ms"] < 0.7 * simulate(config.replace(speculative_config=None)).summary["mean_tpot_ms"]


@pytest.mark.parametrize("kwargs, field", [(dict(replicas=1.5), "replicas"), (dict(replicas=None), "replicas"),
                                           (dict(replicas=True), "replicas"), (dict(workload="poisson"), "workload"),
                                           (dict(until=float("nan")), "until")])
def test_simulate_cluster_names_a_bad_argument_before_the_run(kwargs, field):
    with pytest.raises(ConfigError) as err:
        simulate_cluster(SimulationConfig().replace(workload={"num_requests": 5}), **kwargs)
    assert err.value.field == field


def test_simulate_cluster_needs_a_simulation_config():
    with pytest.raises(ConfigError, match=r"config=None: must be a SimulationConfig"):
        simulate_cluster(None, 2)


def test_a_cluster_beyond_what_one_process_holds_is_refused_before_building_it():
    """simulate_cluster(config, 10**6) built engines until memory ran out (a SystemError under a limit)."""
    from sim.planning.cluster import MAX_REPLICAS
    from sim.planning.sweep import grid
    base = SimulationConfig(workload={"num_requests": 5}, deployment={"cost_model": "linear"},
                            engine={"num_gpu_blocks": 600, "max_model_len": 4096})
    for call, value in ((lambda: simulate_cluster(base, 10**6), 10**6),
                        (lambda: simulate_cluster(base, [{}] * (MAX_REPLICAS + 1)), f"{MAX_REPLICAS + 1} deployments"),
                        (lambda: grid(base, {"replicas": [2, 5000]}), 5000)):
        with pytest.raises(ConfigError, match=f"must be at most {MAX_REPLICAS}") as info:
            call()
        assert info.value.field == "replicas" and info.value.value == value
