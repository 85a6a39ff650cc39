"""Returning the final token's hidden state: hybrid extraction vs post-sampling prefill.

Llama-3.1-8B on one H100 SXM (roofline cost model, shipped calibration), ShareGPT-like prompts,
Poisson arrivals, two kinds of traffic:

- length-bound: ignore_eos, max_tokens fixed (benchmark-style): every stop is known in advance;
- EOS-heavy: the model's EOS ends most answers (natural ShareGPT lengths), max_tokens 2048.

For each, a fraction of the requests asks for hidden states, and each strategy is compared with
the same run without hidden states (`sim.whatif.last_token_whatif.compare_strategies`). Columns: step %
(mean step duration change), added % (seconds added to steps / baseline total step time), peak MiB
(extraction buffer; for post-sampling prefill also the recompute's KV), E2E mean / p99 change over
all requests, asked ms (mean E2E change of the requests that asked), rows copied to the host, and
wasted (speculative rows whose request did not stop).

    python benchmarks/hidden_states_whatif.py [--requests 1000] [--rate 4] [--fractions 0.25 1.0]
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels_cost_model import kv_cache_blocks, make_cost_model  # noqa: E402
from sim.core.config import EngineConfig  # noqa: E402
from sim.whatif.last_token_whatif import compare_strategies  # noqa: E402
from workloads import poisson_workload  # noqa: E402
from workloads.hidden_states import with_hidden_states  # noqa: E402

MODEL, GPU = "llama-3.1-8b", "h100-sxm"


def workloads(rate: float, num_requests: int) -> dict:
    return {
        "length-bound": poisson_workload(rate, num_requests, "sharegpt", max_tokens=256, ignore_eos=True),
        "EOS-heavy": poisson_workload(rate, num_requests, "sharegpt", max_tokens=2048, ignore_eos=False),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.25, 1.0])
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost_model = make_cost_model(MODEL, GPU)
    config = EngineConfig(max_model_len=8192, max_num_batched_tokens=8192)
    blocks = kv_cache_blocks(MODEL, GPU, block_size=config.block_size)
    print(f"{MODEL} on {GPU}, {blocks} KV blocks, {args.requests} requests at {args.rate:g} req/s, "
          f"seed {args.seed}")
    header = (f"{'workload':<13}{'asked':>6} {'strategy':<22}{'step %':>8}{'added %':>8}{'peak MiB':>10}"
              f"{'E2E mean ms':>12}{'E2E p99 ms':>11}{'asked ms':>10}{'rows':>8}{'wasted':>8}")
    print(header)
    print("-" * len(header))
    for name, workload in workloads(args.rate, args.requests).items():
        for fraction in args.fractions:
            cmp = compare_strategies(with_hidden_states(workload, fraction), config, cost_model, blocks,
                                     seed=args.seed)
            for r in cmp.results.values():
                s = r.stats
                print(f"{name:<13}{fraction:>6.2f} {r.strategy:<22}{r.step_time_pct:>+8.2f}"
                      f"{r.added_time_pct:>+8.2f}{r.peak_extra_mib:>10.2f}{1e3 * r.mean_e2e_delta_s:>+12.1f}"
                      f"{1e3 * r.p99_e2e_delta_s:>+11.1f}{1e3 * r.asked_mean_e2e_delta_s:>+10.1f}"
                      f"{s.rows:>8}{s.wasted_rows:>8}")
        base = cmp.baseline
        print(f"{'':<13}(baseline: {len(base.steps)} steps over {base.end_time:.0f} s)")


if __name__ == "__main__":
    main()
