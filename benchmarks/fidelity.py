"""Fidelity against real vLLM runs: replay each measured run and compare, metric by metric.

Reads `../shared/data/real_vllm_runs/` (see its README; never copied into the repo), prints for every
run simulated vs measured TTFT/TPOT/E2E (mean, p50, p90, p99), duration and throughput with the
relative error, and writes latency-CDF and running/waiting plots (PNG) to --out.

    python benchmarks/fidelity.py [--data ../shared/data/real_vllm_runs] [--out fidelity_out]
                                  [--arrivals queued|workload] [--markdown table.md]
"""
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

from sim.fidelity.real_runs import DEFAULT_ROOT, find_runs, read_run
from sim.fidelity.report import compare_run, format_table, markdown_rows, write_plots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_ROOT))
    ap.add_argument("--out", default="fidelity_out")
    ap.add_argument("--arrivals", default="queued", choices=("queued", "workload"))
    ap.add_argument("--markdown", help="also write the per-run x metric table here (Markdown)")
    args = ap.parse_args()
    runs = find_runs(args.data)
    if not runs:
        raise SystemExit(f"no real runs under {args.data}")
    warnings.simplefilter("ignore", UserWarning)  # "uncalibrated roofline" for the RTX PRO 6000
    md = ["| run | metric | sim | real | rel. error |", "|---|---|---|---|---|"]
    for path in runs:
        run = read_run(path)
        t0 = time.perf_counter()
        c = compare_run(run, args.arrivals)
        wall = time.perf_counter() - t0
        kw = run.engine_kwargs
        print(f"\n== {run.name}: TP{kw['tensor_parallel_size']} DP{run.data_parallel_size}"
              f"{' EP' if kw.get('enable_expert_parallel') else ''}, {len(run.measured)} requests, "
              f"KV {c.sim.num_gpu_blocks} blocks/rank, simulated in {wall:.1f} s")
        print(format_table(c))
        for p in write_plots(c, run, Path(args.out)):
            print(f" plot: {p}")
        md += markdown_rows(c)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
