"""Prefill/decode disaggregation: invariants, content invariance across the hand-off, definitions,
determinism and named errors."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from kernels_cost_model.errors import ConfigError
from kernels_cost_model.links import get_link, kv_transfer_bytes
from sim.api.report import format_summary
from sim.api.sections import DeploymentConfig
from sim.api.simulator import SimulationConfig
from sim.core.config import EngineConfig
from sim.core.replay import run_until_stop
from sim.core.sampling_params import SamplingParams
from sim.planning.disagg import DisaggregatedCluster, KVTransferError, simulate_disaggregated
from sim.planning.disagg_config import DisaggConfig, PoolConfig, load_disaggregated
from tests.engine_harness import EOS, engine_configs, scripted_specs
from workloads.spec import RequestSpec
from workloads.token_streams import TokenSource

LINEAR = DeploymentConfig(cost_model="linear")


def _config(engine: EngineConfig, **slo) -> SimulationConfig:
    return SimulationConfig(engine=engine, deployment=LINEAR).replace(slo=slo) if slo else \
        SimulationConfig(engine=engine, deployment=LINEAR)


def _none(value):
    return None if isinstance(value, float) and np.isnan(value) else value


def _run(engine: EngineConfig, specs, num_prefill=1, num_decode=1, link="ib-ndr", first_token="prefill"):
    disagg = DisaggConfig(PoolConfig(num_prefill), PoolConfig(num_decode), link=link, first_token=first_token)
    cluster = DisaggregatedCluster(_config(engine), disagg)
    return cluster, cluster.run(specs)


@given(scripted_specs(), engine_configs(), st.integers(1, 2), st.integers(1, 2), st.sampled_from(["prefill", "decode"]))
def test_every_request_finishes_once_with_the_tokens_run_until_stop_gives(specs, engine, p, d, first_token):
    cluster, out = _run(engine, specs, p, d, first_token=first_token)
    rows = out.requests.set_index("request_id")
    assert sorted(rows.index) == sorted(s.request_id for s in specs)
    source = TokenSource(EOS)
    for prefill in cluster.prefill:      # the token stream is the prefill instance's
        for i, rid in enumerate(prefill.requests.request_id):
            spec = next(s for s in specs if s.request_id == rid)
            stream = [source.token_at(spec, i, k) for k in range(400)]
            expected = run_until_stop(stream, EOS, spec.sampling_params, prompt_len=spec.num_prompt_tokens,
                                      max_model_len=engine.max_model_len, token_text={})
            row = rows.loc[rid]
            assert (row.finish_reason, _none(row.stop_reason)) == (expected.finish_reason, expected.stop_reason)
            assert row.num_output_tokens == len(expected.output_token_ids)
    for engine_ in cluster.prefill + cluster.decode:   # KV conserved and all returned
        assert engine_.state.kv.num_free_blocks == engine_.state.kv.num_usable_blocks
        assert not engine_.by_id
    handed = rows[rows.decode_instance >= 0]
    assert len(out.transfers) == len(handed)
    if first_token == "prefill":   # a request its first token stops never moves
        assert (handed.num_output_tokens >= 2).all() or handed.empty


@settings(max_examples=10)   # each run builds several result tables; the property above covers the space
@given(scripted_specs(max_requests=5), engine_configs())
def test_reruns_are_bit_identical(specs, engine):
    first = _run(engine, specs, 2, 1)[1]
    second = _run(engine, specs, 2, 1)[1]
    pd.testing.assert_frame_equal(first.requests, second.requests)
    assert [list(t) for t in first.results.token_times] == [list(t) for t in second.results.token_times]


def _long_specs(n=6, prompt=300, out=20):
    rng = np.random.default_rng(0)
    return [RequestSpec(0.01 * i, rng.integers(100, 5000, prompt).astype(np.int32), output_len=out,
                        request_id=f"q{i}", sampling_params=SamplingParams(max_tokens=out, ignore_eos=True))
            for i in range(n)]


def test_first_token_comes_from_prefill_and_decode_waits_for_the_kv():
    engine = EngineConfig(num_gpu_blocks=400, max_model_len=1024)
    cluster, out = _run(engine, _long_specs())
    r = out.requests
    assert (r.ttft_s == r.first_token_time - r.arrival_time).all()
    assert (r.kv_transfer_queued >= r.first_token_time).all()
    second = np.array([t[1] for t in out.results.token_times])
    assert (second > r.kv_transfer_end.to_numpy()).all()   # decode starts only after the KV arrived
    link = get_link("ib-ndr")
    expected = link.transfer_time_s(kv_transfer_bytes("llama-3.1-8b", 300))
    on_link = r.kv_transfer_end - r.kv_transfer_start
    alone = ~r.kv_transfer_start.duplicated(keep=False)     # q3 and q4 left prefill in one step
    assert alone.sum() >= 4 and np.allclose(on_link[alone], expected)
    assert np.allclose(on_link[~alone], 2 * expected - link.latency_s)   # half the port each
    assert np.allclose(out.transfers.alone_s, expected)
    assert (r.kv_transfer_bytes == kv_transfer_bytes("llama-3.1-8b", 300)).all()


def test_overlapping_transfers_share_the_prefill_port():
    engine = EngineConfig(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=8192)
    specs = [dataclasses.replace(s, arrival_time_s=0.0) for s in _long_specs(4, prompt=2000)]
    out = _run(engine, specs, link="roce-100g")[1]
    t = out.transfers
    assert ((t.end - t.start) > t.alone_s * 1.5).all()     # all four moved at once, each slower than alone
    assert out.summary["kv_transfer_wait_ms_p99"] > 0
    assert out.transfer_queue.depth.max() >= 2
    rate = get_link("roce-100g").bytes_per_s              # one prefill rank: one port
    assert t.num_bytes.sum() / (t.end.max() - t.start.min()) <= rate * (1 + 1e-9)


def test_a_request_that_stops_on_its_first_token_never_leaves_prefill():
    engine = EngineConfig(num_gpu_blocks=400, max_model_len=1024)
    specs = [dataclasses.replace(s, sampling_params=SamplingParams(max_tokens=1)) for s in _long_specs(3)]
    out = _run(engine, specs)[1]
    assert out.transfers.empty and (out.requests.decode_instance == -1).all()
    assert (out.requests.finish_reason == "length").all()


@pytest.mark.parametrize("first_token", ["prefill", "decode"])
def test_a_request_the_front_end_refuses_is_refused_on_arrival(first_token):
    """Behind `vllm serve` a prompt + max_tokens over max_model_len is refused. The prefill instance
    runs a relaxed copy under first_token="decode", but the decode instance would refuse the client's
    own request: it is refused on arrival (it once reached the decode instance and crashed the run).
    With three prefill instances one sees no request; its empty table must keep its columns' types
    (a rejected row once counted as completed, with E2E 0, when they did not)."""
    engine = EngineConfig(num_gpu_blocks=400, max_model_len=1024, usage_context="openai_api_server")
    specs = _long_specs(4)
    long = SamplingParams(max_tokens=800, ignore_eos=True)   # 300 + 800 > 1024
    specs[1:3] = [dataclasses.replace(s, sampling_params=long) for s in specs[1:3]]
    cluster, out = _run(engine, specs, num_prefill=3, first_token=first_token)
    r = out.requests.set_index("request_id")
    assert r.rejected.dtype == bool and r.completed.dtype == bool
    assert list(r.rejected) == [False, True, True, False]
    assert list(r.completed) == [True, False, False, True]
    assert out.summary["num_rejected"] == 2 and out.summary["completed"] == 2
    assert (r.loc[["q0", "q3"], "num_output_tokens"] == 20).all()
    assert min(len(prefill.requests) for prefill in cluster.prefill) == 0


def test_the_front_end_is_shared_by_both_pools():
    with pytest.raises(ConfigError, match="disaggregation.decode.engine.usage_context"):
        DisaggConfig.from_dict({"decode": {"engine": {"usage_context": "llm_class"}}})


def test_decode_prefix_hits_shrink_the_transfer():
    engine = EngineConfig(num_gpu_blocks=400, max_model_len=1024)
    one = _long_specs(1)[0]
    again = dataclasses.replace(one, arrival_time_s=5.0, request_id="again")
    out = _run(engine, [one, again])[1]
    r = out.requests.set_index("request_id")
    assert r.loc["again", "decode_cached_tokens"] == 288      # 18 full blocks of 16 already on decode
    assert r.loc["again", "kv_transfer_bytes"] == kv_transfer_bytes("llama-3.1-8b", 12)


def test_decode_cache_smaller_than_one_request_is_a_named_error():
    config = _config(EngineConfig(num_gpu_blocks=400, max_model_len=1024))
    disagg = DisaggConfig(PoolConfig(1), PoolConfig(1, engine={"num_gpu_blocks": 10}))
    with pytest.raises(KVTransferError, match="disaggregation.decode.engine.num_gpu_blocks"):
        simulate_disaggregated(config, disagg, workload=_long_specs(1))


def test_bad_pool_settings_name_their_path():
    with pytest.raises(ConfigError, match="disaggregation.prefill.engine.block_size"):
        DisaggConfig.from_dict({"prefill": {"engine": {"block_size": 32}}})
    with pytest.raises(ConfigError, match="disaggregation.decode.num_instances"):
        DisaggConfig.from_dict({"decode": {"num_instances": 0}})
    with pytest.raises(ConfigError, match="link"):
        DisaggConfig.from_dict({"link": "carrier-pigeon"})


def test_toml_gives_pools_ratio_and_link(tmp_path):
    path = tmp_path / "pd.toml"
    path.write_text('[deployment]\nmodel = "llama-3.1-8b"\n[workload]\nrate = 2.0\nnum_requests = 5\n'
                    '[disaggregation]\nlink = "nvlink"\n[disaggregation.prefill]\nnum_instances = 2\n'
                    '[disaggregation.decode]\nnum_instances = 1\ntensor_parallel_size = 2\n'
                    'engine = { max_num_seqs = 64 }\n')
    config, disagg = load_disaggregated(path)
    assert disagg.ratio == "2P:1D" and disagg.link == "nvlink"
    assert disagg.decode.instance_config(config).engine.max_num_seqs == 64
    out = simulate_disaggregated(config, disagg)
    assert out.summary["num_gpus"] == 4 and out.summary["completed"] == 5
    header = format_summary(out.summary, out.results.meta).splitlines()[0]
    assert header.startswith("llama-3.1-8b on 4 GPUs (2P:1D, prefill 2x h100 TP 1, decode 1x h100 TP 2) "
                             "(roofline cost model calibrated on h100-sxm kernels)")
    assert "GPU KV cache size" not in format_summary(out.summary, out.results.meta)  # per pool instead


def test_cli_runs_the_example_and_writes_tables_and_plots(tmp_path, capsys):
    from sim.cli.main import main
    path = tmp_path / "pd.toml"
    text = open("examples/disagg.toml").read().replace("num_requests = 500", "num_requests = 20")
    path.write_text(text)
    assert main(["disagg", "--config", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "Disaggregated 1P:1D over ib-ndr, 2 GPUs" in printed and "KV transfers" in printed
    assert "decode   27,526 KV blocks of 16 tokens per instance; KV occupancy" in printed
    for name in ("requests.csv", "transfers.csv", "summary.json", "kv_occupancy_per_pool.png",
                 "transfer_queue.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert len(pd.read_csv(tmp_path / "out" / "transfers.csv")) <= 20


def test_cli_names_a_pool_whose_step_budget_is_below_its_max_num_seqs(tmp_path, capsys):
    from sim.cli.main import main
    path = tmp_path / "pd.toml"
    small = "engine = { max_num_seqs = 512, max_num_batched_tokens = 256 }"
    path.write_text(open("examples/disagg.toml").read().replace("engine = { max_num_seqs = 512 }", small))
    assert main(["disagg", "--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith(
        "servesim: error: disaggregation.decode.engine.max_num_batched_tokens=256: must be >= max_num_seqs=512")


@pytest.mark.parametrize("pool, line, named", [
    ("decode", 'gpu = "nope"', "disaggregation.decode.gpu='nope': unknown GPU"),
    ("prefill", "tensor_parallel_size = 3", "disaggregation.prefill.tensor_parallel_size=3: must divide"),
])
def test_cli_names_a_pools_gpu_or_tp_by_its_key_in_the_pool_table(tmp_path, capsys, pool, line, named):
    """They were named disaggregation.<pool>.deployment.gpu / .tensor_parallel_size, keys the table has not."""
    from sim.cli.main import main
    path = tmp_path / "pd.toml"
    text = open("examples/disagg.toml").read().replace("tensor_parallel_size = 1\n", "")  # (the prefill pool's)
    path.write_text(text.replace(f"[disaggregation.{pool}]\n", f"[disaggregation.{pool}]\n{line}\n", 1))
    assert main(["disagg", "--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"servesim: error: {named}")


def test_link_catalog_prices_transfers_with_cited_figures():
    from kernels_cost_model.links import _catalog, list_links
    assert {"nvlink4", "pcie5", "ib-ndr", "roce-100g"} <= set(list_links())
    assert all(link.source for link in _catalog()[0].values())
    link = get_link("InfiniBand")
    assert link.name == "ib-ndr"
    assert link.transfer_time_s(0) == 0.0
    assert link.transfer_time_s(50e9) == pytest.approx(5e-6 + 1.0)
    assert link.transfer_time_s(50e9, lanes=2) == pytest.approx(5e-6 + 0.5)
    # llama-3.1-8b: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 128 KiB per token
    assert kv_transfer_bytes("llama-3.1-8b", 10) == 10 * 131072
    with pytest.raises(ConfigError, match="link"):
        get_link("smoke-signals")


def _hybrid_handoff(model, profile, prompt_len=2048, gpu="h100", tp=1, kv_cache_dtype="auto"):
    config = SimulationConfig.from_dict({"deployment": {"model": model, "gpu": gpu, "tensor_parallel_size": tp,
                                                        "kv_cache_dtype": kv_cache_dtype},
                                         "engine": {"scheduler_profile": profile, "max_model_len": 8192}})
    spec = RequestSpec(0.0, (np.arange(prompt_len, dtype=np.int32) * 7) % 30000 + 100, output_len=8,
                       sampling_params=SamplingParams(max_tokens=8), request_id="a")
    out = simulate_disaggregated(config, DisaggConfig(PoolConfig(1), PoolConfig(1)), workload=[spec])
    return int(out.transfers["num_bytes"].iloc[0])


def test_a_hybrid_models_transfer_moves_each_groups_blocks_under_033():
    """gpt-oss-20b, a 2048-token prompt. Under vllm-0.33 NIXL moves, per group, the blocks the group
    holds: the full group's 128, the sliding group's last cdiv(128, 16) + 1 = 9; each block is read in
    all 12 layer slots of a pool block, 16 tokens x 2 (K, V) x 8 KV heads x 64 x 2 bytes each. Under
    vllm-0.19 the connector turns the hybrid manager off: 2048 tokens of all 24 layers, as before."""
    from kernels_cost_model.links import hybrid_kv_transfer_bytes
    page = 16 * 2 * 8 * 64 * 2
    assert _hybrid_handoff("gpt-oss-20b", "vllm-0.33") == (128 + 9) * 12 * page == 53_870_592
    assert _hybrid_handoff("gpt-oss-20b", "vllm-0.19") == 2048 * 24 * page // 16 == \
        kv_transfer_bytes("gpt-oss-20b", 2048) == 100_663_296
    # 1024 tokens already on the decode side: 64 full blocks move, the window's 9 still do
    assert hybrid_kv_transfer_bytes("gpt-oss-20b", 16, 2048, 1024) == (64 + 9) * 12 * page
    assert hybrid_kv_transfer_bytes("gpt-oss-20b", 16, 2048, 2048) == 0          # a full hit: nothing
    assert hybrid_kv_transfer_bytes("gpt-oss-20b", 16, 100) == (7 + 7) * 12 * page  # window not yet full


def test_a_linear_state_models_transfer_moves_one_state_per_group():
    """qwen3-next-80b-a3b on two H200s (blocks of 544 tokens), 2048 tokens, both ranks' shares: the full
    group's 4 blocks, each of 12 slots of 544 x 2 x 2 KV heads x 256 x 2 bytes, and one state per linear
    group (3 groups) and slot: conv (2 x 16 x 128 + 32 x 128) x 3 x 2 bytes plus recurrent 32 x 128 x 128
    x 2 bytes. (Every layer as full attention, as before: 2048 x 48 x 2 x 2 x 256 x 2 = 201,326,592.)"""
    page = 544 * 2 * 2 * 256 * 2
    state = (2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 2
    assert _hybrid_handoff("qwen3-next-80b-a3b", "vllm-0.33", gpu="h200", tp=2) == 12 * (4 * page + 3 * state) == 92_995_584


@pytest.mark.parametrize("pool, field", [
    ({"pipeline_parallel_size": 33}, "disaggregation.decode.pipeline.pipeline_parallel_size=33"),  # 32 layers
    ({"kv_offloading_size": 1e-6}, "disaggregation.decode.kv_offloading_size=1e-06"),             # < one block
    ({"kv_offloading_size": 1, "engine": {"enable_prefix_caching": False}}, "disaggregation.decode.kv_offloading_size"),
    ({"kv_offloading_size": 1, "kv_offloading_link": "tin-can"}, "disaggregation.decode.kv_offloading_link"),
    ({"kv_offloading_size": float("inf")}, "disaggregation.decode.kv_offloading_size=inf: must be a finite number"),
    ({"kv_offloading_size": 1e15}, "disaggregation.decode.kv_offloading_size=1000000000000000.0: must be a finite"),
    ({"kv_offloading_size": True}, "disaggregation.decode.kv_offloading_size=True"),
    ({"num_instances": True}, "disaggregation.decode.num_instances=True: must be an integer"),
    ({"tensor_parallel_size": True}, "disaggregation.decode.tensor_parallel_size=True: must be an integer"),
    ({"pipeline_parallel_size": True}, "disaggregation.decode.pipeline_parallel_size=True: must be an integer"),
])
def test_bad_pool_pp_and_cpu_tier_are_named_errors(pool, field):
    with pytest.raises(ConfigError) as err:
        simulate_disaggregated(SimulationConfig(deployment=LINEAR), DisaggConfig.from_dict({"decode": pool}),
                               workload=[])
    assert str(err.value).startswith(field)


def test_speculative_decoding_with_disaggregation_is_a_named_error():
    config = _config(EngineConfig()).replace(speculative_config={"method": "ngram"})
    with pytest.raises(ConfigError) as err:
        DisaggregatedCluster(config, DisaggConfig())
    assert err.value.field == "speculative_config.method" and err.value.value == "ngram"
    assert "[disaggregation]" in err.value.reason


@pytest.mark.parametrize("first, prefill_stop, decode_stop", [(7, {"stop_token_ids": (7,)}, {"stop": ("\x06",)}),
                                                              (6, {"stop": ("\x06",)}, {"stop_token_ids": (9,)})])
def test_stop_reasons_of_both_kinds_join_across_the_pools(first, prefill_stop, decode_stop):
    """One request stops on its first token (on the prefill instance), another on the decode instance,
    one by a token id and one by a stop string: the joined table holds both (the prefill table's inferred
    dtype refused the other's value with a raw pandas TypeError)."""
    prompt = np.arange(20, dtype=np.int32) + 100
    specs = [RequestSpec(0.0, prompt, output_token_ids=(first, 3, 4), request_id="r0",
                         sampling_params=SamplingParams(max_tokens=20, **prefill_stop)),
             RequestSpec(0.0, prompt + 50, output_token_ids=(3, 4, 5, 6, 9, 8), request_id="r1",
                         sampling_params=SamplingParams(max_tokens=20, **decode_stop))]
    config = SimulationConfig(engine={"num_gpu_blocks": 64, "max_model_len": 256, "block_size": 16},
                              deployment={"cost_model": "linear"})
    out = simulate_disaggregated(config, DisaggConfig(PoolConfig(1), PoolConfig(1), first_token="prefill"),
                                 workload=specs)
    r = out.requests.set_index("request_id")
    assert (r["finish_reason"] == "stop").all() and r["stop_reason"].dtype == object
    assert r.loc["r0", "num_output_tokens"] == 1 and r.loc["r1", "num_output_tokens"] > 1
    assert r.loc["r0", "stop_reason"] == (7 if first == 7 else "\x06")


def _prompt(n: int, base: int) -> np.ndarray:
    return (np.arange(n, dtype=np.int32) % 37) + base


def test_a_transfer_waiting_for_blocks_a_cpu_tier_frees_starts_when_they_are_freed():
    """A decode pool with a CPU tier: finished requests hold their blocks until their stores land, which a
    step end of the tier's releases after the admission hook's; the queued transfer then started at no
    step end and its request never finished (an InvariantError)."""
    specs = [RequestSpec(0.000, _prompt(65, 100), output_len=48, sampling_params=SamplingParams(max_tokens=146),
                         request_id="a"),
             RequestSpec(0.020, _prompt(14, 200), output_len=11, sampling_params=SamplingParams(max_tokens=1),
                         request_id="b"),
             RequestSpec(0.0205, _prompt(209, 300), output_len=148,
                         sampling_params=SamplingParams(max_tokens=19, ignore_eos=True), request_id="c")]
    config = SimulationConfig(
        engine={"block_size": 16, "num_gpu_blocks": 17, "max_model_len": 256, "max_num_seqs": 1,
                "max_num_batched_tokens": 358, "enable_chunked_prefill": False, "enable_prefix_caching": True,
                "usage_context": "llm_class"},
        deployment={"cost_model": "linear"})
    out = simulate_disaggregated(config, DisaggConfig(PoolConfig(1), PoolConfig(1, kv_offloading_size=0.01),
                                                      link="nvlink4"), workload=specs)
    r = out.requests.set_index("request_id")
    assert list(r["num_output_tokens"]) == [48, 1, 19]


def test_a_two_stage_decode_pool_with_one_seat_finishes():
    """Decode PP 2, one seat: the seated request was preempted over and over while requests whose KV had
    landed held the blocks (the pipeline hid the request in flight from the scheduler's preemption)."""
    free = SamplingParams(max_tokens=None, ignore_eos=True)
    specs = [RequestSpec(0.000, _prompt(98, 100), output_len=130, sampling_params=free, request_id="r20"),
             RequestSpec(0.000, _prompt(98, 200), output_len=32,
                         sampling_params=SamplingParams(max_tokens=58, ignore_eos=True), request_id="r21"),
             RequestSpec(0.003, _prompt(114, 300), output_len=45, sampling_params=SamplingParams(max_tokens=None),
                         request_id="r22"),
             RequestSpec(0.203, _prompt(110, 400), output_len=35, sampling_params=SamplingParams(max_tokens=None),
                         request_id="r23"),
             RequestSpec(0.2435, _prompt(36, 500), output_len=25, sampling_params=SamplingParams(max_tokens=34),
                         request_id="r27")]
    config = SimulationConfig(
        engine={"block_size": 4, "num_gpu_blocks": 97, "max_model_len": 128, "max_num_seqs": 1,
                "max_num_batched_tokens": 256, "long_prefill_token_threshold": 50, "enable_prefix_caching": False,
                "scheduler_reserve_full_isl": False, "scheduler_profile": "vllm-0.19", "usage_context": "llm_class"},
        deployment={"cost_model": "linear"})
    out = simulate_disaggregated(config, DisaggConfig(PoolConfig(1), PoolConfig(1, pipeline_parallel_size=2)),
                                 workload=specs, until=1e4)
    assert out.requests["finish_time"].notna().all() and len(out.requests) == 5


def test_a_prefill_pool_under_pp_hands_off_a_request_whose_first_token_was_in_flight():
    """A four-stage prefill pool: the scheduler may not preempt a request whose first token is in flight
    (its token then landed on a request without KV, which decoded on the prefill instance to
    max_model_len: 'length' with 152 outputs where run_until_stop stops on the first, EOS)."""
    def prompt(shared, body):
        return np.concatenate([np.arange(shared, dtype=np.int32) + 500, np.asarray(body, np.int32)])

    r2_body = [26, 4, 11, 19, 38, 10, 16, 40, 25, 40, 28, 15, 9, 19, 11, 8, 31, 38, 27, 31, 5, 31, 38, 21, 18, 6,
               25, 4, 4, 5, 27, 12, 22, 33, 22, 22, 33, 30, 37, 10, 35, 33, 6, 30, 10, 11, 20, 13, 26, 27, 32, 27,
               23, 40, 25, 14, 29, 4, 24, 14, 30, 40, 10, 39, 8, 21, 40, 34, 17, 6, 6, 16, 25, 28, 39, 17, 28, 9,
               13, 13, 39, 22, 17, 35, 13, 39, 33, 30, 11, 36, 30, 34, 28, 16, 6, 19, 33, 38, 33, 4, 35, 40, 28,
               27, 22, 8, 28, 3, 9, 37, 30, 39, 13, 4, 34, 35, 39, 31, 14, 31, 10, 34, 9, 29, 5, 18, 32, 22, 38,
               23, 23, 17, 20, 15, 19, 16, 16, 26, 13, 30, 29, 14, 7, 13, 28, 7, 29, 26, 17, 27, 9, 10, 25, 24, 22,
               14, 35, 16, 13]
    r4_body = [5, 27, 39, 27, 30, 29, 18, 38, 15, 27, 12, 30, 38, 20, 36, 28, 25, 34, 11, 9, 4, 24, 29, 25, 28, 7,
               39, 40, 13, 34, 8, 38, 20, 20, 4, 30, 11, 38, 20, 3, 29, 32, 11, 17, 23, 25, 25, 6, 25, 9, 11, 23,
               33, 27, 38, 38, 36, 11, 34, 36, 21, 18, 12, 19]

    specs = [
        RequestSpec(0.22, prompt(16, r2_body), output_len=3,
                    sampling_params=SamplingParams(max_tokens=10, stop_token_ids=(7,), stop=()),
                    request_id='r2', priority=0),
        RequestSpec(0.2205, prompt(40, r4_body), output_len=1,
                    sampling_params=SamplingParams(max_tokens=3, stop_token_ids=(), stop=('\x07',)),
                    request_id='r4', priority=2),
    ]
    config = SimulationConfig(
        engine={"block_size": 16, "num_gpu_blocks": 17, "max_model_len": 256, "max_num_seqs": 8,
                "max_num_batched_tokens": 64, "long_prefill_token_threshold": 3, "enable_prefix_caching": True,
                "async_scheduling": False, "eos_token_id": 2},
        deployment={"cost_model": "linear", "model": "qwen2.5-0.5b"})
    disagg = DisaggConfig(PoolConfig(1, pipeline_parallel_size=4), PoolConfig(1), first_token="decode")
    out = simulate_disaggregated(config, disagg, workload=specs).requests.set_index("request_id")
    assert (out.loc["r4", "finish_reason"], out.loc["r4", "num_output_tokens"]) == ("stop", 1)
    assert (out.loc["r2", "finish_reason"], out.loc["r2", "num_output_tokens"]) == ("stop", 3)


def test_a_pool_with_no_usable_block_is_named():
    spec = RequestSpec(0.0, np.array([15, 12], dtype=np.int32), output_len=8,
                       sampling_params=SamplingParams(max_tokens=5), request_id="r0")
    config = SimulationConfig(engine={"block_size": 32, "num_gpu_blocks": 1, "max_model_len": 32, "max_num_seqs": 2,
                                      "max_num_batched_tokens": 2, "eos_token_id": 2},
                              deployment={"cost_model": "linear"})
    with pytest.raises(ConfigError, match="disaggregation.prefill.num_gpu_blocks=1: request 'r0' needs 1 blocks"):
        simulate_disaggregated(config, DisaggConfig(PoolConfig(1), PoolConfig(1)), workload=[spec])


@pytest.mark.parametrize("model, profile", [("llama-3.1-8b", "vllm-0.33"), ("gpt-oss-20b", "vllm-0.33"),
                                            ("gpt-oss-20b", "vllm-0.19")])
def test_an_fp8_kv_cache_moves_half_the_bytes(model, profile):
    """NIXL moves the cache's blocks as stored: with kv_cache_dtype fp8 (one byte a value, where bf16 takes
    two) every page moves half the bytes, in the plain and the per-group transfer alike."""
    full = _hybrid_handoff(model, profile)
    assert _hybrid_handoff(model, profile, kv_cache_dtype="fp8") * 2 == full
    assert kv_transfer_bytes("llama-3.1-8b", 10, "fp8") == 10 * 131072 // 2


def test_a_pool_link_whose_feature_is_off_is_still_checked_and_said_to_change_nothing():
    """A pool's pipeline_link without PP, or kv_offloading_link without a CPU tier, prices nothing: a typo
    in it is still named, and a link other than the default warns; the default itself passes quietly."""
    with pytest.raises(ConfigError, match="pipeline_link"):
        PoolConfig(1, pipeline_link="nvlnk")
    with pytest.warns(UserWarning, match="kv_offloading_link='pcie4' changes nothing without kv_offloading_size"):
        PoolConfig(1, kv_offloading_link="pcie4")
    with pytest.warns(UserWarning, match="pipeline_link='pcie5' changes nothing without pipeline_parallel_size"):
        PoolConfig(1, pipeline_link="pcie5")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PoolConfig(1)
        PoolConfig(1, pipeline_parallel_size=2, pipeline_link="pcie5")
