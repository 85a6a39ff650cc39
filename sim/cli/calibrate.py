"""`servesim calibrate`: the cost model's kernel fits (kernels_cost_model.cli), plus `--from-run`.

    servesim calibrate --from-run RUN_DIR --out deployment.toml

fits the host figures of a measured vLLM run with the kernels held at their calibration
(sim.fidelity.from_run), prints the fit and the held-out error, and writes a config file that
`servesim run --config deployment.toml` reads, its fitted figures labelled.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from kernels_cost_model.cli import add_calibrate_parser


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = add_calibrate_parser(subparsers)
    p.add_argument("--from-run", type=Path, metavar="RUN_DIR",
                   help="fit host figures (engine time per request, collective scale) from a measured vLLM run "
                        "folder (meta.json, requests.jsonl; the shared runs' format) and write a deployment file")
    kernels = p.get_default("func")
    p.set_defaults(func=lambda args: run_from_run(args) if args.from_run else kernels(args))
    return p


def run_from_run(args) -> int:
    from kernels_cost_model.errors import require
    from sim.fidelity.from_run import HELD_OUT_RULE, fit_from_run, write_deployment
    from sim.fidelity.real_runs import read_run
    require(args.from_run.is_dir(), "--from-run", str(args.from_run),
            "not a folder (give a measured run's folder, with meta.json and requests.jsonl)"
            if args.from_run.exists() else "folder not found")
    run = read_run(args.from_run)
    fit = fit_from_run(run)
    out = args.out or Path(f"deployment-{run.name}.toml")
    figures = ", ".join(f"{f} = {getattr(fit.host, f)!r}" for f in fit.fitted)
    print(f"{run.name}: fitted {figures} (kernels held at their calibration)")
    for split, errors in (("fit split", fit.fit_error), (f"held out ({HELD_OUT_RULE})", fit.held_out_error)):
        print(f"  {split:48s} " + "  ".join(f"{m} {e * 100:+6.1f}%" for m, e in errors.items()))
    print("wrote", write_deployment(out, run, fit))
    return 0
