"""`servesim disagg`: run a prefill/decode disaggregated deployment from a TOML file.

    servesim disagg --config examples/disagg.toml [--seed 1] [--out runs/pd]

The file holds the usual sections plus [disaggregation] (docs/topologies.md). Prints the summary,
per-pool KV occupancy and KV-transfer figures; `--out` writes requests.csv, transfers.csv,
summary.json and the per-pool KV occupancy and transfer-queue plots.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

TRANSFER_LINES = (("num_kv_transfers", "KV transfers", 1, "{:,.0f}"),
                  ("kv_transfer_bytes", "bytes moved (GB)", 1e-9, "{:,.2f}"),
                  ("kv_transfer_ms_mean", "time on link, mean (ms)", 1, "{:.3f}"),
                  ("kv_transfer_wait_ms_p99", "slowed by sharing the link, p99 (ms)", 1, "{:.3f}"))


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("disagg", help="prefill/decode disaggregated deployment (TOML with [disaggregation])",
                              description="Simulate a prefill/decode disaggregated deployment from a TOML file: the"
                              " sections of servesim run's --config plus [disaggregation] (pools, P:D ratio, link;"
                              " docs/topologies.md, examples/disagg.toml). Prints the summary, per-pool KV occupancy"
                              " and the KV transfers.")
    p.add_argument("--config", required=True, help="TOML: [engine], [deployment], [workload], [slo], [disaggregation]")
    p.add_argument("--seed", type=int, help="override the file's seed")
    p.add_argument("--out", help="folder for requests.csv, transfers.csv, summary.json and plots")
    p.add_argument("--first-token", choices=("decode", "prefill"),
                   help="whose first token the client sees (override [disaggregation] first_token)")
    p.set_defaults(func=run_disagg)
    return p


def run_disagg(args) -> int:
    from sim.api.report import format_summary
    from sim.api.results import summary_json
    from sim.planning.disagg import simulate_disaggregated
    from sim.planning.disagg_config import load_disaggregated
    from sim.api.table_io import check_output_folder
    config, disagg = load_disaggregated(args.config)
    check_pool_budgets(config, disagg)
    if args.out:
        check_output_folder(args.out)
    if args.seed is not None:
        config = config.replace(seed=args.seed)
    if args.first_token:
        import dataclasses
        disagg = dataclasses.replace(disagg, first_token=args.first_token)
    out = simulate_disaggregated(config, disagg)
    print(format_summary(out.summary, out.results.meta))
    print(f"\nDisaggregated {disagg.ratio} over {disagg.link}, {out.summary['num_gpus']} GPUs, "
          f"first token from {disagg.first_token}")
    print("\n".join(pool_lines(out.summary, out.results.meta)))
    if args.out:
        folder = save(out, Path(args.out), summary_json)
        print(f"wrote {folder}")
    return 0


def check_pool_budgets(config, disagg) -> None:
    """Each pool's step budget covers its max_num_seqs, as vLLM requires of every instance."""
    from kernels_cost_model.errors import ConfigError
    from sim.api.validation import check_step_budget
    from sim.planning.disagg_config import pool_field
    for pool in ("prefill", "decode"):
        try:
            check_step_budget(getattr(disagg, pool).instance_config(config).engine)
        except ConfigError as exc:
            raise ConfigError(pool_field(pool, exc.field), exc.value, exc.reason) from None


def pool_lines(summary: dict, meta: dict | None = None) -> list[str]:
    blocks = (meta or {}).get("pool_gpu_blocks", {})
    size = (meta or {}).get("block_size")
    lines = [f"{pool:<8} " + (f"{blocks[pool]:,} KV blocks of {size} tokens per instance; " if pool in blocks else "")
             + f"KV occupancy mean {summary[f'{pool}_kv_occupancy_mean']:.1%}, "
             f"peak {summary[f'{pool}_kv_occupancy_peak']:.1%}" for pool in ("prefill", "decode")]
    width = max(len(label) for _, label, _, _ in TRANSFER_LINES) + 2  # (a value never touches its label)
    lines += [f"{label:<{width}}{fmt.format(summary[key] * scale)}" for key, label, scale, fmt in TRANSFER_LINES]
    return lines


def save(out, folder: Path, summary_json) -> Path:
    from sim.api.table_io import make_output_folder
    from sim.plots.topology import plot_pool_kv_occupancy, plot_transfer_queue
    make_output_folder(folder)
    out.requests.to_csv(folder / "requests.csv", index=False)
    out.transfers.to_csv(folder / "transfers.csv", index=False)
    (folder / "summary.json").write_text(json.dumps({"summary": summary_json(out.summary),
                                                     "meta": out.results.meta}, indent=2, default=str))
    steps = {pool: out.pool_steps(pool) for pool in ("prefill", "decode")}
    blocks = {"prefill": out.prefill[0].meta["num_gpu_blocks"], "decode": out.decode[0].meta["num_gpu_blocks"]}
    plot_pool_kv_occupancy(steps, blocks).savefig(folder / "kv_occupancy_per_pool.png")
    plot_transfer_queue(out.transfer_queue).savefig(folder / "transfer_queue.png")
    return folder
