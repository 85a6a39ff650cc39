"""`servesim calibrate`: the cost model's kernel fits (kernels_cost_model.cli), plus `--from-run`.

    servesim calibrate --from-run RUN_DIR --out deployment.toml
    servesim calibrate --from-run result.json --model llama-3.1-8b --gpu h100 --tp 1 \
        --max-num-seqs 256 --max-num-batched-tokens 8192 --out deployment.toml

fits the host figures of a measured vLLM run (a run folder in the shared runs' format, or a
`vllm bench serve --save-result --save-detailed` JSON file) with the kernels held at their calibration
(sim.fidelity.from_run), prints the fit and the held-out error, and writes a config file that
`servesim run --config deployment.toml` reads, its fitted figures labelled.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from kernels_cost_model.cli import add_calibrate_parser


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = add_calibrate_parser(subparsers)
    p.add_argument("--from-run", type=Path, metavar="RUN",
                   help="fit host figures (engine time per request, collective scale) from a measured vLLM run and "
                        "write a deployment file: a run folder in the shared runs' format (meta.json, requests.jsonl) "
                        "or a `vllm bench serve --save-result --save-detailed` JSON file (give --model, --gpu and the "
                        "server's engine arguments below)")
    g = p.add_argument_group("--from-run with a vllm bench serve result (the server's engine arguments)")
    g.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1, help="tensor parallel size")
    g.add_argument("--max-num-seqs", type=int, help="the server's --max-num-seqs (unset: vllm serve's default for the GPU)")
    g.add_argument("--max-num-batched-tokens", type=int, help="the server's --max-num-batched-tokens (unset: vllm serve's default for the GPU)")
    g.add_argument("--max-model-len", type=int, help="the server's --max-model-len (default: the model's)")
    g.add_argument("--block-size", type=int, default=16, help="KV block size (default 16)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="default 0.9")
    g.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    g.add_argument("--no-enable-prefix-caching", dest="prefix_caching", action="store_false",
                   help="the server ran with prefix caching off")
    g.add_argument("--num-gpu-blocks", type=int, help="the KV blocks the server allocated (its start-up log's "
                   "'GPU KV cache size: N tokens' / block size); default: servesim sizes the cache")
    g.add_argument("--vllm-version", default="", help="the server's vLLM release (picks a calibration measured "
                   "under it where one ships, e.g. 0.19)")
    kernels = p.get_default("func")
    p.set_defaults(func=lambda args: run_from_run(args) if args.from_run else kernels(args))
    return p


def measured_run(args):
    """The run `--from-run` names: a run folder, or a vllm bench serve result with the flags' engine."""
    from kernels_cost_model.errors import require
    from sim.fidelity.bench_serve import read_bench_serve
    from sim.fidelity.real_runs import read_run
    path = args.from_run
    require(path.exists(), "--from-run", str(path), "not found")
    if path.is_dir():
        require((path / "meta.json").is_file(), "--from-run", str(path), "a folder without meta.json: not a run"
                " folder in the shared runs' format (meta.json, requests.jsonl, timeseries.csv)")
        return read_run(path)
    require(path.suffix == ".json", "--from-run", str(path),
            "neither a run folder (with meta.json and requests.jsonl) nor a vllm bench serve result (.json)")
    # (unset batch flags take vllm serve's defaults; the model and GPU have none)
    for flag, value, what in (("--model", args.model, "model"), ("--gpu", args.gpu, "GPU")):
        require(bool(value), flag, value, f"required with a vllm bench serve result ({path.name}): give the server's"
                                          f" {what}")
    engine = {"model": args.model, "tensor_parallel_size": args.tp, "max_num_seqs": args.max_num_seqs,
              "max_num_batched_tokens": args.max_num_batched_tokens, "max_model_len": args.max_model_len,
              "block_size": args.block_size, "gpu_memory_utilization": args.gpu_memory_utilization,
              "kv_cache_dtype": args.kv_cache_dtype, "enable_prefix_caching": args.prefix_caching,
              "num_gpu_blocks": args.num_gpu_blocks}
    return read_bench_serve(path, engine, args.gpu, args.vllm_version)


def kv_line(run) -> str:
    """What the replay's KV cache holds: the blocks the run recorded, beside servesim's own sizing."""
    from sim.fidelity.kv_check import sized_gpu_blocks
    sized, recorded = sized_gpu_blocks(run), run.recorded_blocks
    if recorded is None:
        return (f"KV cache: {sized} blocks as servesim sizes it (the run records none: give --num-gpu-blocks, or "
                "put vLLM's start-up log in the run folder)")
    return f"KV cache: {recorded} blocks as the run recorded (servesim would size {sized}, {sized / recorded - 1:+.1%})"


def run_from_run(args) -> int:
    from sim.fidelity.from_run import HELD_OUT_RULE, fit_from_run, write_deployment
    run = measured_run(args)
    fit = fit_from_run(run)
    out = args.out or Path(f"deployment-{run.name}.toml")
    figures = ", ".join(f"{f} = {getattr(fit.host, f)!r}" for f in fit.fitted)
    print(f"{run.name}: fitted {figures} (kernels held at their calibration)")
    print("  " + kv_line(run))
    for split, errors in (("fit split", fit.fit_error), (f"held out ({HELD_OUT_RULE})", fit.held_out_error)):
        print(f"  {split:48s} " + "  ".join(f"{m} {e * 100:+6.1f}%" for m, e in errors.items()))
    print("wrote", write_deployment(out, run, fit))
    return 0
