"""Speculative decoding what-if: speedup vs load for one model, GPU and method, against a published
measurement.

1. Closed loop at fixed batch sizes (SpecDecode-Bench's setup, arXiv 2601.11580: vLLM v0.10.1 on
   one H100, Llama-3.1-8B-Instruct, k = 3, speedup = generated tokens/s with SD / without):
   simulated speedups vs the two figures the study states in words for this model
   (specdecode-bench.github.io, "End-to-End Performance"):
   - GSM8K, batch 128: 1.21x (EAGLE family);
   - ShareGPT, EAGLE: the speedup drops 4.3% from batch 1 to batch 32.
2. Open loop (Poisson, ShareGPT lengths): TPOT, median end-to-end latency and throughput with and
   without speculation vs request rate, for the method and for n-gram (low acceptance; k and 5),
   and the rate from which each stops paying.

    python benchmarks/spec_decode.py [--requests 300] [--method eagle3] [--k 3] [--plot speedup.png]
"""
from __future__ import annotations

import argparse

from sim.api.simulator import SimulationConfig, simulate
from workloads import ClosedLoopClients, poisson_workload
from workloads.lengths import Independent, Uniform

MODEL, GPU = "llama-3.1-8b", "h100"
#: GSM8K-like lengths: the range of prompt and generated lengths in SpecDecode-Bench's gsm8k
#: records for Llama-3.1-8B (github.com/SpecDecode-Bench/simulator, data/llama3.1-8B).
GSM8K_LENGTHS = Independent(Uniform(100, 160), Uniform(150, 400))
PUBLISHED_GSM8K_BS128 = 1.21
PUBLISHED_SHAREGPT_DROP_1_TO_32 = 0.043


def config(spec: dict | None) -> SimulationConfig:
    """Both sides with synchronous scheduling, as the measurement presumably ran (vLLM's
    AsyncScheduler first left speculative decoding as a TODO)."""
    base = SimulationConfig().replace(deployment={"model": MODEL, "gpu": GPU},
                                      engine={"max_model_len": 8192, "async_scheduling": False})
    return base.replace(speculative_config=spec) if spec else base


def closed_loop_speedup(lengths, dataset: str, batch: int, num_requests: int, method: str, k: int) -> dict:
    """Generated-token throughput with and without speculation at a fixed concurrency."""
    workload = ClosedLoopClients(batch, max(num_requests, 3 * batch), lengths, max_tokens=None)
    spec = {"method": method, "num_speculative_tokens": k, "acceptance_dataset": dataset}
    plain = simulate(config(None), workload=workload).summary
    fast = simulate(config(spec), workload=workload).summary
    return {"speedup": fast["output_throughput"] / plain["output_throughput"],
            "acceptance_length": fast["spec_decode_acceptance_length"]}


def open_loop_row(rate: float, num_requests: int, method: str, k: int) -> dict:
    workload = poisson_workload(rate=rate, num_requests=num_requests, lengths="sharegpt")
    dataset = "sharegpt" if method == "eagle3" else "default"  # n-gram: its GSM8K-measured default
    spec = {"method": method, "num_speculative_tokens": k, "acceptance_dataset": dataset}
    plain = simulate(config(None), workload=workload).summary
    fast = simulate(config(spec), workload=workload).summary
    return {"rate": rate, "tpot_plain": plain["mean_tpot_ms"], "tpot_spec": fast["mean_tpot_ms"],
            "tpot_speedup": plain["mean_tpot_ms"] / fast["mean_tpot_ms"],
            "e2e_speedup": plain["median_e2el_ms"] / fast["median_e2el_ms"],
            "throughput_plain": plain["output_throughput"],
            "throughput_spec": fast["output_throughput"]}


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--method", default="eagle3")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--rates", type=float, nargs="+", default=[2, 8, 12, 16, 24, 32])
    parser.add_argument("--plot", metavar="PNG", help="also save speedup vs batch size and vs rate")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    print(f"{MODEL} on one {GPU}, {args.method}, k={args.k}\n")
    print("Closed loop (fixed batch size), speedup of generated tokens/s")
    results = {}
    for name, lengths in (("gsm8k", GSM8K_LENGTHS), ("sharegpt", "sharegpt")):
        for batch in (1, 8, 32, 128):
            row = closed_loop_speedup(lengths, name, batch, args.requests // 4, args.method, args.k)
            results[name, batch] = row["speedup"]
            print(f"  {name:9s} batch {batch:4d}: speedup {row['speedup']:.2f}x "
                  f"(acceptance length {row['acceptance_length']:.2f})")
    sim_128 = results["gsm8k", 128]
    error = (sim_128 - PUBLISHED_GSM8K_BS128) / PUBLISHED_GSM8K_BS128
    print(f"\n  GSM8K batch 128: simulated {sim_128:.2f}x vs published {PUBLISHED_GSM8K_BS128:.2f}x "
          f"(error {100 * error:+.1f}%)")
    drop = 1 - results["sharegpt", 32] / results["sharegpt", 1]
    print(f"  ShareGPT drop batch 1 -> 32: simulated {100 * drop:.1f}% vs published "
          f"{100 * PUBLISHED_SHAREGPT_DROP_1_TO_32:.1f}% ({100 * (drop - PUBLISHED_SHAREGPT_DROP_1_TO_32):+.1f} points)")
    curves = {f"{method} k={k}": open_loop_table(method, k, args.rates, args.requests)
              for method, k in dict.fromkeys(((args.method, args.k), ("ngram", args.k), ("ngram", 5)))}
    if args.plot:
        save_plot(args.plot, results, curves)


def save_plot(path: str, closed: dict, curves: dict) -> None:
    """Speedup vs batch size (with the published point) and vs request rate, side by side."""
    from sim.plots import new_figure
    fig, (left, right) = new_figure(1, 2, size=(11, 4.2))
    for name in ("gsm8k", "sharegpt"):
        batches = sorted(b for n, b in closed if n == name)
        left.plot(batches, [closed[name, b] for b in batches], marker="o", label=f"simulated, {name}")
    left.plot([128], [PUBLISHED_GSM8K_BS128], "k*", markersize=10, label="measured, gsm8k (SpecDecode-Bench)")
    left.set(xscale="log", xlabel="batch size (closed loop)", ylabel="speedup (tokens/s)")
    for method, rows in curves.items():
        right.plot([r["rate"] for r in rows], [r["e2e_speedup"] for r in rows], marker="o", label=method)
    right.axhline(1.0, color="grey", lw=1)
    right.set(xlabel="request rate (req/s, Poisson, ShareGPT)", ylabel="speedup of median E2E")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Speculative decoding on {MODEL}, one {GPU}")
    fig.savefig(path, dpi=120)
    print(f"\nwrote {path}")


def open_loop_table(method: str, k: int, rates: list[float], num_requests: int) -> list[dict]:
    print(f"\nOpen loop (Poisson, ShareGPT lengths), {method} k={k}: speedup vs request rate")
    print(f"  {'rate':>6s} {'TPOT plain':>11s} {'TPOT spec':>10s} {'TPOT x':>7s} {'E2E p50 x':>10s}"
          f" {'tok/s plain':>12s} {'tok/s spec':>11s}")
    stops_paying, rows = None, []
    for rate in rates:
        r = open_loop_row(rate, num_requests, method, k)
        rows.append(r)
        print(f"  {rate:6.1f} {r['tpot_plain']:9.1f}ms {r['tpot_spec']:8.1f}ms {r['tpot_speedup']:6.2f}x "
              f"{r['e2e_speedup']:9.2f}x {r['throughput_plain']:12.0f} {r['throughput_spec']:11.0f}")
        if stops_paying is None and r["e2e_speedup"] < 1:
            stops_paying = rate
    print(f"  {method} stops paying (median E2E) at {stops_paying} req/s" if stops_paying
          else f"  {method} pays at every rate tried")
    return rows

if __name__ == "__main__":
    main()
