"""Results of a disaggregated run: one row per request across both pools, per-instance results,
the transfer log.

A handed-off request has a row on its prefill instance (arrival to first token) and one on its
decode instance (KV arrival to finish); the global row joins them: arrival, first scheduled, first
token and cached tokens from prefill, finish, output count and finish reason from decode, token times
of both. TTFT, TPOT and E2E keep their definitions (sim.api.metrics) on that row.
"""
from __future__ import annotations

import dataclasses
from array import array
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.api.metrics import add_latency_columns, describe, summarize
from sim.api.results import Results
from sim.api.cost_setup import describe_cost_model

FROM_DECODE = ("finish_time", "num_output_tokens", "finish_reason", "stop_reason")
DERIVED = ("ttft_s", "e2e_s", "queueing_s", "tpot_s", "completed")
KV_KEYS = ("kv_occupancy_mean", "kv_occupancy_peak", "kv_time_above_90pct")


@dataclass
class DisaggResults:
    """`results`: all requests (columns prefill_instance, decode_instance, kv_transfer_*);
    `prefill`/`decode`: each instance's own Results; `transfers`, `transfer_queue`: the link log."""

    results: Results
    prefill: list
    decode: list
    transfers: pd.DataFrame
    transfer_queue: pd.DataFrame

    @property
    def summary(self) -> dict:
        return self.results.summary

    @property
    def requests(self) -> pd.DataFrame:
        return self.results.requests

    def pool_steps(self, pool: str) -> pd.DataFrame:
        """Steps of every instance of `pool` ("prefill" or "decode"), with an `instance` column."""
        parts = {"prefill": self.prefill, "decode": self.decode}[pool]
        return pd.concat([p.steps.assign(instance=i) for i, p in enumerate(parts)], ignore_index=True)


def collect_results(cluster) -> DisaggResults:
    end, slo = cluster.env.now, cluster.config.slo.as_dict()
    prefill = [Results.from_records(e.records(end), slo=slo, meta={"pool": "prefill", "instance": i})
               for i, e in enumerate(cluster.prefill)]
    decode = [Results.from_records(e.records(end), slo=slo, meta={"pool": "decode", "instance": i})
              for i, e in enumerate(cluster.decode)]
    transfers = cluster.log.transfers()
    requests, tokens = join_requests(prefill, decode, transfers, cluster.disagg.first_token == "decode")
    blocks = sum(p.meta["num_gpu_blocks"] for p in prefill + decode)
    summary = summarize(requests, pd.DataFrame({"duration": [], "kv_blocks_used": []}).iloc[0:0],
                        tokens, blocks, slo)
    summary.update(pool_summary("prefill", prefill), **pool_summary("decode", decode))
    summary.update({key: v for key, v in pool_summary("all", prefill + decode).items()
                    for key in [key.removeprefix("all_")]})
    summary.update(transfer_summary(transfers))
    summary["num_gpus"] = (cluster.disagg.prefill.num_gpus(cluster.config)
                           + cluster.disagg.decode.num_gpus(cluster.config))
    config = dict(dataclasses.asdict(cluster.config), disaggregation=dataclasses.asdict(cluster.disagg))
    meta = {"config": config, "ratio": cluster.disagg.ratio,
            "num_gpu_blocks": blocks, "block_size": cluster.config.engine.block_size,
            "end_time": end, "slo": slo, "num_gpus": summary["num_gpus"],
            "pools": pools_label(cluster.disagg, cluster.config),
            "pool_gpu_blocks": {"prefill": prefill[0].meta["num_gpu_blocks"],
                                "decode": decode[0].meta["num_gpu_blocks"]},
            "cost_model_description": describe_cost_model(cluster.prefill[0].cost_model)}
    return DisaggResults(Results(requests, pd.DataFrame(), tokens, summary, meta), prefill, decode,
                         transfers, cluster.log.queue())


def pools_label(disagg, config) -> str:
    """'1P:1D, prefill 1x h100 TP 1, decode 1x h100 TP 1 PP 2': the header's hardware of a P:D deployment."""
    parts = []
    for name in ("prefill", "decode"):
        pool = getattr(disagg, name)
        deployment = pool.instance_config(config).deployment
        pp = pool.pipeline_parallel_size
        parts.append(f"{name} {pool.num_instances}x {deployment.gpu} TP {deployment.tensor_parallel_size}"
                     + (f" PP {pp}" if pp > 1 else ""))
    return f"{disagg.ratio}, " + ", ".join(parts)


def join_requests(prefill: list, decode: list, transfers: pd.DataFrame,
                  first_from_decode: bool = False) -> tuple[pd.DataFrame, list]:
    """One row per request (by arrival), prefill and decode halves joined by request_id; with
    `first_from_decode` the first token (time and token times) is the decode instance's."""
    from_decode = FROM_DECODE + ("first_token_time",) * first_from_decode
    rows = pd.concat([p.requests.assign(prefill_instance=i) for i, p in enumerate(prefill)], ignore_index=True)
    tokens = [array("d", t) if t is not None else None for p in prefill for t in p.token_times]
    rows = rows.drop(columns=list(DERIVED))
    rows["decode_instance"] = -1
    rows["decode_cached_tokens"] = 0
    at = {rid: i for i, rid in enumerate(rows["request_id"])}
    for d, part in enumerate(decode):
        for j, rec in enumerate(part.requests.itertuples(index=False)):
            i = at[rec.request_id]
            for column in from_decode:
                rows.at[i, column] = getattr(rec, column)
            rows.at[i, "num_preemptions"] += rec.num_preemptions
            rows.at[i, "decode_instance"] = d
            rows.at[i, "decode_cached_tokens"] = rec.num_cached_tokens
            if tokens[i] is not None and part.token_times[j] is not None:
                if first_from_decode:
                    del tokens[i][:]
                tokens[i].extend(part.token_times[j])
    rows = _with_transfers(rows, transfers)
    order = np.argsort(rows["arrival_time"].to_numpy(), kind="stable")
    rows = rows.iloc[order].reset_index(drop=True)
    return add_latency_columns(rows), [tokens[i] for i in order]


def _with_transfers(rows: pd.DataFrame, transfers: pd.DataFrame) -> pd.DataFrame:
    t = transfers.set_index("request_id")
    ids = rows["request_id"]
    rows["kv_transfer_bytes"] = ids.map(t["num_bytes"]).fillna(0).astype(np.int64)
    rows["kv_transfer_queued"] = ids.map(t["queued"])
    rows["kv_transfer_start"] = ids.map(t["start"])
    rows["kv_transfer_end"] = ids.map(t["end"])
    return rows


def pool_summary(pool: str, parts: list) -> dict:
    """Block-weighted KV occupancy of a pool's instances, prefixed by the pool's name."""
    blocks = [p.meta["num_gpu_blocks"] for p in parts]
    return {f"{pool}_{key}": float(np.average([p.summary[key] for p in parts], weights=blocks))
            for key in KV_KEYS}


def transfer_summary(transfers: pd.DataFrame) -> dict:
    """KV transfer count, bytes, time on the link and (`kv_transfer_wait_ms`) how much longer than
    alone that was because other transfers shared the link (ms)."""
    out = {"num_kv_transfers": len(transfers), "kv_transfer_bytes": int(transfers["num_bytes"].sum())}
    slowed = (transfers["end"] - transfers["start"] - transfers["alone_s"]).clip(lower=0.0)
    out.update(describe(slowed, "kv_transfer_wait_ms", 1e3))
    out.update(describe(transfers["end"] - transfers["start"], "kv_transfer_ms", 1e3))
    return out
