"""What sharing the link costs: TTFT and KV transfer time with transfers sharing each instance's
interfaces (sim.planning.transfer, max-min fair) against the same run with every transfer moving
alone (shared=False, a what-if no network gives).

Setup: Llama-3.1-8B, H100s, 4 prefill : 1 decode instances over 100 GbE RoCE (12.5 GB/s per port,
kernels_cost_model/data/links.csv), 4000-token prompts (512 MB of KV each: 41 ms alone), 100 output
tokens, Poisson arrivals; the client's first token comes from decode, so the transfer counts in TTFT.
All four prefill instances send into the one decode instance's port, which is where they contend.

    python benchmarks/kv_transfer_contention.py [--requests 300] [--rates 2 4 6 8] [--link roce-100g]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels_cost_model.links import get_link  # noqa: E402
from sim.api.simulator import SimulationConfig  # noqa: E402
from sim.planning.disagg import DisaggregatedCluster  # noqa: E402
from sim.planning.disagg_config import DisaggConfig, PoolConfig  # noqa: E402
from sim.planning.transfer import LinkFabric  # noqa: E402
from workloads import poisson_workload  # noqa: E402
from workloads.lengths import Fixed, Independent  # noqa: E402

KEYS = ("median_ttft_ms", "p99_ttft_ms", "kv_transfer_ms_mean", "kv_transfer_ms_p99")


def run(rate: float, requests: int, link: str, shared: bool) -> dict:
    config = SimulationConfig(seed=0).replace(
        deployment={"model": "llama-3.1-8b", "gpu": "h100"}, engine={"max_model_len": 8192})
    cluster = DisaggregatedCluster(config, DisaggConfig(PoolConfig(4), PoolConfig(1), link=link))
    cluster.fabric = LinkFabric(cluster.env, get_link(link), [1] * 4, [1], cluster.log, shared=shared)
    workload = poisson_workload(rate, requests, Independent(Fixed(4000), Fixed(100)), ignore_eos=True)
    return cluster.run(workload).summary


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rates", type=float, nargs="+", default=[2.0, 4.0, 6.0, 8.0])
    parser.add_argument("--link", default="roce-100g")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    print(f"{'rate':>5} {'link':>7} " + " ".join(f"{k:>20}" for k in KEYS))
    for rate in args.rates:
        for shared in (False, True):
            s = run(rate, args.requests, args.link, shared)
            print(f"{rate:5.1f} {'shared' if shared else 'alone':>7} " + " ".join(f"{s[k]:20.1f}" for k in KEYS))


if __name__ == "__main__":
    main()
