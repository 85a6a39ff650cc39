"""Fidelity against real vLLM runs: replay each measured run and compare, metric by metric.

Reads `../shared/data/real_vllm_runs/` (see its README; never copied into the repo), prints for every
run simulated vs measured TTFT/TPOT/E2E (mean, p50, p90, p99), duration and throughput with the
relative error, and writes latency-CDF and running/waiting plots (PNG) to --out. Replays use nothing
fitted end to end to these runs: kernels and collectives at their shipped calibration, the engine's CPU
term at its default. `--fit` also fits two host figures end to end, each on its own run
(`sim.fidelity.fit`), and prints every run with them too, labelled as fitted. `--leave-gpu-out` replays
with the runs' GPU treated as uncalibrated instead: kernels at the defaults derived from every *other*
calibrated GPU, at its datasheet peaks, and no per-GPU measurement of it (no collective sweep, no
mixed-batch attention rates, no decode-imbalance alphas; `sim.fidelity.replay.leave_gpu_out_cost_model`).

    python benchmarks/fidelity.py [--data ../shared/data/real_vllm_runs] [--out fidelity_out]
                                  [--arrivals queued|workload] [--markdown table.md] [--fit | --leave-gpu-out]
"""
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

from sim.fidelity.fit import COLLECTIVE_FIT_RUN, CPU_FIT_RUN, fit_host
from sim.fidelity.host import UNFITTED
from sim.fidelity.real_runs import DEFAULT_ROOT, find_runs, read_run
from sim.fidelity.replay import leave_gpu_out_cost_model
from sim.fidelity.report import HEADLINE, compare_run, format_table, markdown_rows, write_plots


def headline(c) -> str:
    agg = c.aggregates.set_index("metric")["rel_error"]
    return "  ".join(f"{m.split('_')[0]} {agg[m] * 100:+6.1f}%" for m in HEADLINE)


def role(name: str, fitted_host: bool) -> str:
    if not fitted_host:
        return "nothing fitted to it"
    fitted = [f for f, run in (("cpu_per_request_s", CPU_FIT_RUN), ("collective_scale", COLLECTIVE_FIT_RUN))
              if run == name]
    return f"fit run for {', '.join(fitted)}" if fitted else "held out from the host fit"


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_ROOT))
    ap.add_argument("--out", default="fidelity_out")
    ap.add_argument("--arrivals", default="queued", choices=("queued", "workload"))
    ap.add_argument("--markdown", help="also write the per-run x metric table here (Markdown)")
    ap.add_argument("--fit", action="store_true", help="also fit two host figures end to end and show them")
    ap.add_argument("--leave-gpu-out", action="store_true",
                    help="replay with the runs' GPU uncalibrated: defaults derived from the other calibrated GPUs")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.fit and args.leave_gpu_out:
        ap.error("--fit fits host figures around the shipped calibration: give it or --leave-gpu-out, not both")
    kernels = ("the GPU uncalibrated: kernels derived from the other calibrated GPUs, datasheet peaks"
               if args.leave_gpu_out else "kernels at the shipped calibration")
    runs = find_runs(args.data)
    if not runs:
        raise SystemExit(f"no real runs under {args.data}")
    warnings.simplefilter("ignore", UserWarning)
    fitted = fit_host({p.name: read_run(p) for p in runs}) if args.fit else None
    md = ["| run | metric | sim | real | rel. error |", "|---|---|---|---|---|"]
    summary = []
    for path in runs:
        run = read_run(path)
        t0 = time.perf_counter()
        c = compare_run(run, args.arrivals, UNFITTED,
                        leave_gpu_out_cost_model(run) if args.leave_gpu_out else None)
        wall = time.perf_counter() - t0
        kw = run.engine_kwargs
        print(f"\n== {run.name}: TP{kw['tensor_parallel_size']} DP{run.data_parallel_size}"
              f"{' EP' if kw.get('enable_expert_parallel') else ''}, {len(run.measured)} requests, "
              f"KV {c.sim.num_gpu_blocks} blocks/rank, nothing fitted end to end, {kernels}, simulated in {wall:.1f} s")
        print(format_table(c))
        for p in write_plots(c, run, Path(args.out)):
            print(f" plot: {p}")
        md += markdown_rows(c)
        summary.append((run.name, headline(c), headline(compare_run(run, args.arrivals, fitted)) if fitted else ""))
    goal = "20 %, datasheet figures only" if args.leave_gpu_out else "10 %"
    print(f"\nHeadline relative errors (goal: within {goal}), nothing fitted end to end to these runs; {kernels}")
    for name, unfitted, with_fit in summary:
        print(f" {name:28s} {role(name, False):34s} {unfitted}")
        if with_fit:
            print(f" {'':28s} {'FITTED ' + role(name, True):34s} {with_fit}  ({fitted})")
    if args.markdown:
        Path(args.markdown).write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
