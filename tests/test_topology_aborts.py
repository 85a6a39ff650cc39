"""Client aborts under disaggregation and pipeline parallelism: every request finishes exactly once,
KV is returned on every instance and tier, and a request the abort did not reach keeps the output
`run_until_stop` gives."""
from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings, strategies as st

from sim.api.sections import DeploymentConfig
from sim.api.simulator import SimulationConfig
from sim.core.replay import run_until_stop
from sim.core.sampling_params import SamplingParams
from sim.planning.disagg import DisaggregatedCluster
from sim.planning.disagg_config import DisaggConfig, PoolConfig
from sim.planning.instances import InstanceShape, simulate_instance
from sim.planning.offload import OffloadConfig
from sim.planning.pipeline import PipelineConfig
from tests.engine_harness import EOS, engine_configs, scripted_specs
from workloads.spec import RequestSpec
from workloads.token_streams import TokenSource

LINEAR = DeploymentConfig(cost_model="linear")


@st.composite
def aborting(draw, max_requests=8):
    """Scripted specs, some with an abort time shortly after their arrival."""
    specs = draw(scripted_specs(max_requests=max_requests))
    delays = st.one_of(st.none(), st.sampled_from([0.0, 1e-6, 1e-5, 1e-4, 1e-3, 5e-3, 0.02, 0.1]))
    return [dataclasses.replace(s, abort_time_s=None if (d := draw(delays)) is None else s.arrival_time_s + d)
            for s in specs]


def expected(spec, engine_config, index):
    stream = [TokenSource(EOS).token_at(spec, index, k) for k in range(400)]
    return run_until_stop(stream, EOS, spec.sampling_params, prompt_len=spec.num_prompt_tokens,
                          max_model_len=engine_config.max_model_len, token_text={})


def assert_answers(rows, specs, engine_config, index_of):
    """Each request once; aborted ones say so; the others have run_until_stop's output."""
    assert sorted(rows.index) == sorted(s.request_id for s in specs)
    for spec in specs:
        row = rows.loc[spec.request_id]
        want = expected(spec, engine_config, index_of[spec.request_id])
        if row.finish_reason == "abort":
            assert spec.abort_time_s is not None and row.finish_time >= spec.abort_time_s - 1e-12
            assert row.num_output_tokens <= len(want.output_token_ids)
        else:
            assert (row.finish_reason, row.num_output_tokens) == (want.finish_reason, len(want.output_token_ids))


def _disagg(engine, specs, p, d, pp, offload, abort_in_transfer="wait"):
    pool = {"pipeline_parallel_size": pp, "kv_offloading_size": 0.01 if offload else None}
    config = SimulationConfig(engine=engine, deployment=LINEAR)
    if offload:
        config = config.replace(engine={"enable_prefix_caching": True})
    cluster = DisaggregatedCluster(config, DisaggConfig(PoolConfig(p, **pool), PoolConfig(d, **pool), link="roce-100g",
                                                        abort_in_transfer=abort_in_transfer))
    return cluster, cluster.run(specs)


@settings(deadline=None)
@given(aborting(), engine_configs(), st.integers(1, 2), st.integers(1, 2), st.sampled_from([1, 2]), st.booleans(),
       st.sampled_from(["wait", "cancel"]))
def test_disaggregated_aborts_finish_once_and_release_kv_everywhere(specs, engine, p, d, pp, offload, on_link):
    cluster, out = _disagg(engine, specs, p, d, pp, offload, on_link)
    rows = out.requests.set_index("request_id")
    index_of = {rid: i for e in cluster.prefill for i, rid in enumerate(e.requests.request_id)}
    assert_answers(rows, specs, cluster.prefill[0].config, index_of)
    assert max(cluster.num_finished.values(), default=1) == 1
    for e in cluster.prefill + cluster.decode:
        assert e.state.kv.num_free_blocks == e.state.kv.num_usable_blocks and not e.by_id
        assert getattr(e.state.kv, "num_cpu_blocks", 1) >= 0
    assert not cluster.handoffs and not cluster.in_flight and not any(cluster.pending) and not any(cluster.arrived)


@settings(deadline=None)
@given(aborting(), engine_configs(), st.sampled_from([2, 4]), st.booleans())
def test_pipeline_aborts_finish_once_and_release_kv(specs, engine, pp, offload):
    config = SimulationConfig(engine=engine, deployment=LINEAR)
    if offload:
        config = config.replace(engine={"enable_prefix_caching": True})
    shape = InstanceShape(PipelineConfig(pp), OffloadConfig(num_cpu_blocks=8) if offload else None)
    results = simulate_instance(config, shape, workload=specs)   # raises if a request never finishes
    rows = results.requests.set_index("request_id")
    assert_answers(rows, specs, engine, {rid: i for i, rid in enumerate(results.requests.request_id)})
    assert results.summary["max_batches_in_flight"] <= pp


def _long(n=4, prompt=3000, out=50, abort=None):
    rng = np.random.default_rng(1)
    return [RequestSpec(0.0, rng.integers(100, 5000, prompt).astype(np.int32), output_len=out, request_id=f"q{i}",
                        sampling_params=SamplingParams(max_tokens=out, ignore_eos=True), abort_time_s=abort)
            for i in range(n)]


def _cluster(decode_blocks=None, abort_in_transfer="wait"):
    """One prefill and one decode H100 over 100 GbE (a 3000-token prompt takes ms on the link)."""
    config = SimulationConfig(deployment=DeploymentConfig(model="llama-3.1-8b", gpu="h100")).replace(
        engine={"max_model_len": 4096})
    decode = PoolConfig(1, engine={"num_gpu_blocks": decode_blocks} if decode_blocks else {})
    return DisaggregatedCluster(config, DisaggConfig(PoolConfig(1), decode, link="roce-100g",
                                                     abort_in_transfer=abort_in_transfer))


def test_an_abort_during_the_kv_transfer_lands_then_finishes_once():
    cluster = _cluster()
    plain = cluster.run(_long(1))
    t = plain.transfers.iloc[0]
    mid = (t.start + t.end) / 2
    cluster = _cluster()
    out = cluster.run(_long(1, abort=mid))
    row = out.requests.iloc[0]
    assert row.finish_reason == "abort" and row.finish_time == t.end      # takes effect as the KV lands
    assert row.num_output_tokens == 0 and len(out.transfers) == 1   # the decode instance never answered
    for e in cluster.prefill + cluster.decode:
        assert e.state.kv.num_free_blocks == e.state.kv.num_usable_blocks
    assert len(cluster.decode[0].requests.request_id) == 1                   # the decode half exists, aborted


def test_an_abort_while_decoding_stops_on_the_decode_instance():
    cluster = _cluster()
    plain = cluster.run(_long(1))
    t_end = plain.transfers.iloc[0].end
    finish = plain.requests.iloc[0].finish_time
    cluster = _cluster()
    row = cluster.run(_long(1, abort=(t_end + finish) / 2)).requests.iloc[0]
    assert row.finish_reason == "abort" and 1 < row.num_output_tokens < 50 and row.decode_instance == 0


def test_an_abort_while_waiting_for_decode_blocks_frees_the_prefill_side_at_once():
    plain = _cluster(300).run(_long(2))                  # 300 blocks: one 3000-token request at a time
    transfers = plain.transfers.set_index("request_id")
    assert transfers.loc["q1", "queued"] > transfers.loc["q0", "end"]   # q1 waited for q0's blocks
    when = (transfers.loc["q0", "end"] + transfers.loc["q1", "queued"]) / 2
    specs = _long(2)
    specs[1] = dataclasses.replace(specs[1], abort_time_s=when)
    cluster = _cluster(300)
    out = cluster.run(specs)
    row = out.requests.set_index("request_id").loc["q1"]
    assert row.finish_reason == "abort" and row.finish_time == when and row.num_output_tokens == 0  # the client saw no token
    assert list(out.transfers.request_id) == ["q0"]      # its KV never moved
    for e in cluster.prefill + cluster.decode:
        assert e.state.kv.num_free_blocks == e.state.kv.num_usable_blocks


def test_a_cancelled_transfer_frees_both_sides_and_its_link_share_at_once():
    """abort_in_transfer = "cancel": q1 (sharing the link with q0) is aborted mid-transfer: it
    finishes then, both instances hold only q0's blocks, and q0's KV lands sooner than when shared."""
    specs = _long(2, out=5)
    plain = _cluster().run(specs).transfers.set_index("request_id")
    assert plain.loc["q0", "start"] == plain.loc["q1", "start"]            # one prefill step, one shared link
    when = plain.loc["q1", "start"] + (plain.loc["q1", "end"] - plain.loc["q1", "start"]) / 4
    specs[1] = dataclasses.replace(specs[1], abort_time_s=when)
    cluster = _cluster(abort_in_transfer="cancel")
    seen = {}

    def spy(t, now, inner=cluster._transfer_done):
        seen.update({e: e.state.kv.num_free_blocks for e in cluster.prefill + cluster.decode})
        return inner(t, now)
    cluster._transfer_done = spy
    out = cluster.run(specs)
    rows, transfers = out.requests.set_index("request_id"), out.transfers.set_index("request_id")
    assert rows.loc["q1", "finish_reason"] == "abort" and rows.loc["q1", "finish_time"] == when
    assert list(transfers.index) == ["q0"] and transfers.loc["q0", "end"] < plain.loc["q0", "end"]
    blocks_of_one = -(-3000 // cluster.config.engine.block_size)
    for e in cluster.prefill + cluster.decode:     # as q0 lands, only its blocks are held
        assert e.state.kv.num_usable_blocks - seen[e] == blocks_of_one
        assert e.state.kv.num_free_blocks == e.state.kv.num_usable_blocks
    waited = _cluster().run(specs).requests.set_index("request_id")
    assert waited.loc["q1", "finish_time"] == plain.loc["q1", "end"]      # "wait": at the landing


def test_abort_in_transfer_must_be_wait_or_cancel():
    import pytest
    from kernels_cost_model.errors import ConfigError
    with pytest.raises(ConfigError, match="abort_in_transfer"):
        DisaggConfig.from_dict({"abort_in_transfer": "drop"})
