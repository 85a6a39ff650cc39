"""`servesim run`: simulate one configuration and print its summary (optionally save tables and plots)."""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from kernels_cost_model.errors import ConfigError

DESCRIPTION = """\
Simulate one serving configuration and print a summary table.

With no arguments it runs the built-in default: Llama-3.1-8B on one H100 (calibrated roofline cost
model), the vLLM scheduling policy with chunked prefill and prefix caching, 1000 requests of
ShareGPT-like lengths arriving as a Poisson process at 5 req/s, seed 0. A --config TOML file
([engine], [deployment], [workload], [slo] sections and `seed`) replaces the default; flags
override either."""

EXAMPLES = """\
examples:
  servesim run
  servesim run --rate 20 --num-requests 2000 --slo-ttft 500ms --slo-tpot 50ms
  servesim run --model llama-3.1-70b --gpu h100 --tp 4 --policy vllm --max-num-seqs 512
  servesim run --trace azure_conv.csv --target-rate 10 --out runs/azure
  servesim run --config my_setup.toml --seed 3 --out runs/seed3 --format csv

exit codes: 0 success, 1 unexpected failure, 2 usage or configuration error
(one line on stderr: servesim: error: <field>=<value>: <reason>)"""

# flag dest -> (section, field); a flag left unset leaves the config's value alone
FIELDS = {
    "model": ("deployment", "model"), "gpu": ("deployment", "gpu"),
    "tp": ("deployment", "tensor_parallel_size"),
    "gpu_memory_utilization": ("deployment", "gpu_memory_utilization"),
    "cost_model": ("deployment", "cost_model"),
    "policy": ("engine", "policy"), "max_num_seqs": ("engine", "max_num_seqs"),
    "max_num_batched_tokens": ("engine", "max_num_batched_tokens"),
    "max_model_len": ("engine", "max_model_len"), "block_size": ("engine", "block_size"),
    "num_gpu_blocks": ("engine", "num_gpu_blocks"),
    "long_prefill_token_threshold": ("engine", "long_prefill_token_threshold"),
    "chunked_prefill": ("engine", "enable_chunked_prefill"),
    "prefix_caching": ("engine", "enable_prefix_caching"),
    "scheduler_profile": ("engine", "scheduler_profile"), "async_scheduling": ("engine", "async_scheduling"),
    "workload": ("workload", "kind"), "rate": ("workload", "rate"),
    "num_requests": ("workload", "num_requests"), "lengths": ("workload", "lengths"),
    "cv": ("workload", "cv"), "num_users": ("workload", "num_users"),
    "max_tokens": ("workload", "max_tokens"), "shared_prefix_len": ("workload", "shared_prefix_len"),
    "trace": ("workload", "path"), "trace_format": ("workload", "format"),
    "target_rate": ("workload", "target_rate"),
    "slo_ttft": ("slo", "ttft_s"), "slo_tpot": ("slo", "tpot_s"), "slo_e2e": ("slo", "e2e_s"),
}


def duration(text: str) -> float:
    """'0.5', '0.5s' or '500ms' -> seconds."""
    value = text.strip().lower()
    scale = 1e-3 if value.endswith("ms") else 1.0
    try:
        return float(value.removesuffix("ms").removesuffix("s")) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 0.5, 0.5s, 500ms)") from None


def add_config_flags(p: argparse.ArgumentParser) -> None:
    """The flags that change a SimulationConfig (shared with other subcommands)."""
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML file with the whole setup")
    g = p.add_argument_group("deployment")
    g.add_argument("--model", help="catalog model, e.g. llama-3.1-8b, qwen2.5-7b, llama-3.1-70b")
    g.add_argument("--gpu", help="catalog GPU, e.g. h100, a100, h200, l40s, mi300x")
    g.add_argument("--tp", type=int, metavar="N", help="tensor-parallel size (GPUs per replica)")
    g.add_argument("--gpu-memory-utilization", type=float, metavar="F", help="fraction of GPU memory")
    g.add_argument("--cost-model", choices=("roofline", "linear"), help="step-time model")
    g = p.add_argument_group("engine")
    g.add_argument("--policy", help="scheduling policy (default vllm)")
    for flag, what in (("--max-num-seqs", "requests in one batch"),
                       ("--max-num-batched-tokens", "token budget of one step"),
                       ("--max-model-len", "longest prompt + output"),
                       ("--block-size", "tokens per KV block"),
                       ("--num-gpu-blocks", "KV-cache size (default: sized from model and GPU)"),
                       ("--long-prefill-token-threshold", "cap on one request's prefill chunk")):
        g.add_argument(flag, type=int, metavar="N", help=what)
    g.add_argument("--no-chunked-prefill", dest="chunked_prefill", action="store_const", const=False,
                   help="prefill each prompt whole in one step")
    g.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_const", const=False,
                   help="disable automatic prefix caching")
    g.add_argument("--scheduler-profile", metavar="NAME",
                   help="vLLM release whose scheduler to follow: vllm (newest), vllm-0.33, vllm-0.19")
    g.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_const", const=False,
                   help="apply each step's tokens before scheduling the next (vLLM's default is async)")
    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=("poisson", "gamma", "closed_loop", "sessions"),
                   help="arrival process (default poisson); --trace selects trace replay")
    g.add_argument("--rate", type=float, metavar="R", help="arrival rate, requests/s")
    g.add_argument("--num-requests", type=int, metavar="N", help="requests to simulate")
    g.add_argument("--lengths", metavar="PRESET", help="length preset: sharegpt, arxiv_summarization, bwb_translation, azure_conv, azure_code, mooncake_conversation")
    g.add_argument("--cv", type=float, help="gamma arrivals: coefficient of variation")
    g.add_argument("--num-users", type=int, metavar="N", help="closed loop: concurrent clients")
    g.add_argument("--max-tokens", type=int, metavar="N", help="cap every request's output")
    g.add_argument("--shared-prefix-len", type=int, metavar="N", help="tokens of a common prompt prefix")
    g.add_argument("--trace", metavar="PATH", help="replay a trace file (Azure, Mooncake, BurstGPT, CSV)")
    g.add_argument("--trace-format", metavar="FMT", help="azure, mooncake, burstgpt or generic (default: detected)")
    g.add_argument("--target-rate", type=float, metavar="R", help="rescale trace arrivals to R req/s")
    g.add_argument("--seed", type=int, help="random seed (same seed, same results)")
    g = p.add_argument_group("SLO (for goodput and attainment)")
    for flag in ("ttft", "tpot", "e2e"):
        g.add_argument(f"--slo-{flag}", type=duration, metavar="T",
                       help=f"{flag.upper()} target, seconds or with a unit: 0.5, 500ms")


def config_from_args(args):
    """The SimulationConfig the flags describe (ConfigError on a bad value)."""
    from sim.api.simulator import SimulationConfig
    config = SimulationConfig.from_toml(args.config) if args.config else SimulationConfig()
    sections: dict[str, dict] = {}
    for dest, (section, name) in FIELDS.items():
        value = getattr(args, dest, None)
        if value is not None:
            sections.setdefault(section, {})[name] = value
    if getattr(args, "trace", None):
        sections["workload"]["kind"] = "trace"
    if getattr(args, "seed", None) is not None:
        sections["seed"] = args.seed
    try:
        return config.replace(**sections)
    except TypeError as exc:
        raise ConfigError("config", sections, str(exc)) from None


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("run", help="simulate one configuration and print its summary",
                              description=DESCRIPTION, epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flags(p)
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, metavar="DIR",
                   help="write requests/steps/tokens tables, summary.json, summary.txt and plots/")
    g.add_argument("--format", choices=("parquet", "csv"),
                   help="table format (default: parquet when pyarrow is installed, else csv)")
    g.add_argument("--plot-format", choices=("png", "svg", "none"), default="png", help="plot files")
    g.add_argument("--json", action="store_true", help="print the summary as JSON, not a table")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line on stderr (default: when stderr is a terminal)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """Handler of `servesim run`."""
    from sim.api.simulator import simulate
    from sim.api.progress import Progress
    from sim.api.report import format_summary
    from sim.api.results import summary_json
    config = config_from_args(args)
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    known = config.workload.kind in ("poisson", "gamma", "closed_loop")
    progress = Progress(config.workload.num_requests if known else None) if show else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = simulate(config, progress=progress)
    if progress is not None:
        progress.close()
    for warning in caught:
        print(f"servesim: warning: {warning.message}", file=sys.stderr)
    table = format_summary(results.summary, results.meta)
    if args.out:
        save_run(results, args.out, args.format, args.plot_format, table)
    print(json.dumps(summary_json(results.summary), indent=2) if args.json else table)
    return 0


def save_run(results, out: Path, fmt: str | None, plot_format: str, table: str) -> None:
    """Tables, summary and plots of one run into `out`."""
    from sim.api.results import parquet_available
    fmt = fmt or ("parquet" if parquet_available() else "csv")
    results.save(out, fmt)
    (out / "summary.txt").write_text(table + "\n")
    written = [f"{fmt} tables", "summary.json", "summary.txt"]
    if plot_format != "none":
        from sim.plots.run_plots import save_plots
        paths = save_plots(results, out / "plots", plot_format)
        written.append(f"{len(paths)} plots in plots/")
    print(f"wrote {', '.join(written)} to {out}", file=sys.stderr)
