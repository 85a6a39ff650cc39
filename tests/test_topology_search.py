"""Capacity search over topologies: candidates from [search], named errors, ranking and costs."""
import pytest

from kernels_cost_model.errors import ConfigError
from sim.api.simulator import SimulationConfig, simulate
from sim.planning.plan import Plan
from sim.planning.topology import Topology, search_topologies

TINY = """
seed = 0
[deployment]
cost_model = "linear"
[engine]
num_gpu_blocks = 2048
max_model_len = 4096
[workload]
num_requests = 30
max_tokens = 32
rate = 10.0
[target]
rate = 10.0
ttft_p99_s = 0.5
[search]
topologies = ["aggregated", "disaggregated"]
pd_ratios = ["1:1", "2:1"]
pipeline_parallel_sizes = [1, 2]
offload = [false, true]
kv_offloading_size = 8
seeds = [0]
rel_tol = 0.1
executor = "serial"
curve_points = [1.0]
[prices]
h100 = 3.0
"""


def plan_from(tmp_path, text=TINY) -> Plan:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return Plan.from_toml(path)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    text = TINY.replace("pipeline_parallel_sizes = [1, 2]", "pipeline_parallel_sizes = [1]")
    return search_topologies(plan_from(tmp_path_factory.mktemp("topo"), text))


def test_candidates_are_the_product_of_the_search_axes(tmp_path):
    plan = plan_from(tmp_path)
    labels = [t.label for t in plan.topologies]
    assert len(labels) == len(set(labels)) == 2 * 2 * 3   # PP x offload x (agg, 1P:1D, 2P:1D)
    assert "h100 TP1 PP2 2P:1D +cpu-kv" in labels and "h100 TP1 agg" in labels
    gpus = {t.label: t.gpus_per_unit for t in plan.topologies}
    assert gpus["h100 TP1 PP2 2P:1D +cpu-kv"] == 6 and gpus["h100 TP1 agg"] == 1


def test_plain_plan_has_no_topologies(tmp_path):
    text = TINY.split("[search]")[0] + "[search]\nseeds = [0]\n"
    assert plan_from(tmp_path, text).topologies == ()


@pytest.mark.parametrize("line, field", [
    ('topologies = ["mixed"]', "search.topologies"),
    ("pipeline_parallel_sizes = [33]", "search.pipeline_parallel_sizes"),  # 32 layers
    ('pd_ratios = ["2-1"]', "search.pd_ratios"),
    ('pd_ratios = ["0:1"]', "search.pd_ratios"),
    ('offload = ["yes"]', "search.offload"),
    ("kv_offloading_size = 0", "search.kv_offloading_size=0"),
    ('kv_transfer_link = "carrier-pigeon"', "search.kv_transfer_link='carrier-pigeon'"),
    ('kv_offloading_link = "carrier-pigeon"', "search.kv_offloading_link"),
    ("pipeline_parallel_sizes = []", "search.pipeline_parallel_sizes"),
])
def test_bad_search_axes_are_named_errors(tmp_path, line, field):
    key = line.split(" =")[0]
    text = "\n".join(ln for ln in TINY.splitlines() if not ln.startswith(key + " =")) + "\n"
    with pytest.raises(ConfigError) as err:
        plan_from(tmp_path, text.replace("[search]\n", f"[search]\n{line}\n"))
    assert str(err.value).startswith(field)


def test_the_plain_aggregated_unit_is_the_plain_engine():
    config = SimulationConfig().replace(deployment={"cost_model": "linear"}, workload={"num_requests": 20})
    t = Topology(gpu=config.deployment.gpu)
    assert t.run(config) == dict(simulate(config).summary)


def test_ranking_costs_and_goodput_per_gpu(report):
    table = report.table
    assert list(table["rank"]) == list(range(1, len(table) + 1))
    assert table["feasible"].all()
    costs = list(table["usd_per_million_output_tokens"])
    assert costs == sorted(costs)
    for _, row in table.iterrows():
        assert row["num_gpus"] == row["replicas"] * row["gpus_per_replica"]
        assert row["usd_per_hour"] == pytest.approx(row["num_gpus"] * 3.0)
        assert row["goodput_per_gpu"] == pytest.approx(row["capacity_per_replica"] / row["gpus_per_replica"])
        assert row["replicas"] * row["capacity_per_replica"] >= 10.0 - 1e-9   # units cover the target
        assert row["p99_ttft_ms_at_target"] <= 500.0
        assert row["usd_per_million_tokens"] < row["usd_per_million_output_tokens"]
    assert set(table["topology"]) == {"aggregated", "disaggregated"}


def test_cost_per_token_follows_from_the_target_rate(report):
    for _, row in report.table.iterrows():
        tokens_per_hour = 10.0 * row["output_tokens_per_request"] * 3600
        assert row["output_tokens_per_request"] == pytest.approx(32)   # max_tokens, no EOS in the tiny traffic
        assert row["usd_per_million_output_tokens"] == pytest.approx(row["usd_per_hour"] / tokens_per_hour * 1e6)


def test_curves_and_capacities_cover_every_topology(report):
    assert set(report.curves["candidate"]) == set(report.table["candidate"]) == set(report.capacities)


def test_search_is_deterministic(tmp_path, report):
    text = TINY.replace("pipeline_parallel_sizes = [1, 2]", "pipeline_parallel_sizes = [1]")
    again = search_topologies(plan_from(tmp_path, text))
    assert again.table.equals(report.table)


def test_the_example_topology_plan_loads():
    from pathlib import Path
    plan = Plan.from_toml(Path(__file__).resolve().parent.parent / "examples" / "topology_plan.toml")
    assert len(plan.topologies) == 12 and {t.offload for t in plan.topologies} == {False, True}


PER_POOL = TINY.replace("pipeline_parallel_sizes = [1, 2]\noffload = [false, true]\n",
                        "prefill_tensor_parallel_sizes = [1]\ndecode_tensor_parallel_sizes = [1, 2]\n"
                        "decode_offload = [false, true]\n").replace('pd_ratios = ["1:1", "2:1"]', 'pd_ratios = ["2:1"]')


def test_per_pool_axes_give_disaggregated_candidates_with_their_own_pools(tmp_path):
    plan = plan_from(tmp_path, PER_POOL)
    labels = [t.label for t in plan.topologies]
    # aggregated from the shared axes; disaggregated: prefill TP1 x decode TP {1, 2} x decode offload {no, yes}
    assert labels == ["h100 TP1 agg", "h100 TP1 2P:1D", "h100 2P(TP1):1D(TP1 +cpu-kv)",
                      "h100 2P(TP1):1D(TP2)", "h100 2P(TP1):1D(TP2 +cpu-kv)"]
    t = plan.topologies[3]
    assert t.gpus_per_unit == 2 * 1 + 1 * 2
    disagg = t.disagg()
    assert disagg.decode.tensor_parallel_size == 2 and disagg.prefill.tensor_parallel_size is None
    assert plan.topologies[2].disagg().decode.kv_offloading_size == 8
    assert plan.topologies[2].disagg().prefill.kv_offloading_size is None


def test_a_decode_pool_on_more_gpus_is_priced_for_them(tmp_path):
    text = PER_POOL.replace("decode_offload = [false, true]\n", "").replace('"aggregated", ', "")
    report = search_topologies(plan_from(tmp_path, text))
    table = report.table.set_index("candidate")
    assert set(table.index) == {"h100 TP1 2P:1D", "h100 2P(TP1):1D(TP2)"}
    wide = table.loc["h100 2P(TP1):1D(TP2)"]
    assert wide["gpus_per_replica"] == 4 and wide["decode_tensor_parallel_size"] == 2
    assert wide["usd_per_hour"] == pytest.approx(wide["replicas"] * 4 * 3.0)
    costs = list(report.table["usd_per_million_output_tokens"])
    assert report.table["feasible"].all() and costs == sorted(costs)


@pytest.mark.parametrize("line, field", [
    ("decode_pipeline_parallel_sizes = [33]", "search.decode_pipeline_parallel_sizes"),
    ("prefill_tensor_parallel_sizes = [0]", "search.prefill_tensor_parallel_sizes"),
    ('decode_offload = ["yes"]', "search.decode_offload"),
    ("decode_tensor_parallel_sizes = []", "search.decode_tensor_parallel_sizes"),
])
def test_bad_per_pool_axes_are_named_errors(tmp_path, line, field):
    text = PER_POOL.replace("decode_offload = [false, true]\n", "").replace("[search]\n", f"[search]\n{line}\n")
    text = "\n".join(ln for ln in text.splitlines() if not (ln.startswith(line.split(" =")[0] + " =") and ln != line))
    with pytest.raises(ConfigError) as err:
        plan_from(tmp_path, text + "\n")
    assert str(err.value).startswith(field)


def test_per_pool_axes_need_disaggregated_candidates(tmp_path):
    text = PER_POOL.replace('topologies = ["aggregated", "disaggregated"]', 'topologies = ["aggregated"]')
    with pytest.raises(ConfigError, match="search.decode_"):
        plan_from(tmp_path, text)


def test_speculative_decoding_with_pp_or_disaggregated_candidates_is_a_plan_error(tmp_path):
    spec = '[speculative_config]\nmethod = "eagle3"\n'
    with pytest.raises(ConfigError) as err:
        plan_from(tmp_path, TINY + spec)
    assert err.value.field == "speculative_config.method" and "candidate 'h100 TP1 1P:1D'" in err.value.reason
    aggregated = TINY.replace('["aggregated", "disaggregated"]', '["aggregated"]').replace("[1, 2]", "[1]")
    assert len(plan_from(tmp_path, aggregated + spec).topologies) == 2
