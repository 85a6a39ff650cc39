"""`servesim run`: simulate one configuration and print its summary (optionally save tables and plots)."""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from sim.cli.arg_types import human_int, human_int_or_auto
from sim.cli.output import add_output_flags, check_result_path, save_outputs, summary_options
from sim.cli.topology_flags import add_topology_flags, simulate_from_args
from kernels_cost_model.errors import ConfigError
from sim.core.batch_defaults import PERFORMANCE_MODES, USAGE_CONTEXTS
from workloads.arrivals import GAMMA_CV

DESCRIPTION = """\
Simulate one serving configuration and print a summary table.

With no arguments it runs the built-in default: Llama-3.1-8B on one H100 (calibrated roofline cost
model), the vLLM scheduling policy with chunked prefill and prefix caching, 1000 requests of
ShareGPT-like lengths arriving as a Poisson process at 5 req/s, seed 0. A --config TOML file
([engine], [deployment], [workload], [slo] sections and `seed`) replaces the default; flags
override either. Flags carry vLLM's engine-argument and `vllm bench serve` names; the short
forms (--tp, --rate, --num-requests, --no-chunked-prefill, ...) are aliases."""

EXAMPLES = """\
examples:
  servesim run
  servesim run --request-rate 20 --num-prompts 2000 --goodput ttft:500 tpot:50
  servesim run --model llama-3.1-70b --gpu h100 --tensor-parallel-size 4 --max-num-seqs 512
  servesim run --trace azure_conv.csv --target-rate 10 --out runs/azure
  servesim run --config my_setup.toml --seed 3 --out runs/seed3 --table-format csv
  servesim run --save-result --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99
  servesim run --rate 2 --speculative-config '{"method": "eagle3", "num_speculative_tokens": 3}'
  servesim run --model llama-3.1-70b -tp 4 -pp 2 --kv-offloading-size 200
  servesim run --model qwen3-30b-a3b -dp 4 --enable-expert-parallel --request-rate 40
  servesim run --conversations conversation_trace.jsonl --num-prompts 600 --kv-offloading-size 100

exit codes: 0 success, 1 unexpected failure, 2 usage or configuration error
(one line on stderr: servesim: error: <field>=<value>: <reason>)"""

# flag dest -> (section, field); a flag left unset leaves the config's value alone
FIELDS = {
    "model": ("deployment", "model"), "gpu": ("deployment", "gpu"),
    "tp": ("deployment", "tensor_parallel_size"), "dp": ("deployment", "data_parallel_size"),
    "gpu_memory_utilization": ("deployment", "gpu_memory_utilization"),
    "cost_model": ("deployment", "cost_model"), "async_scheduling": ("engine", "async_scheduling"),
    "cpu_gpu_overlap": ("deployment", "cpu_gpu_overlap"),
    "kv_cache_dtype": ("deployment", "kv_cache_dtype"),
    "enable_expert_parallel": ("deployment", "enable_expert_parallel"),
    "kv_cache_dtype": ("deployment", "kv_cache_dtype"), "calibration": ("deployment", "calibration"),
    "interconnect": ("deployment", "interconnect"), "clocks": ("deployment", "clocks"),
    "policy": ("engine", "policy"), "max_num_seqs": ("engine", "max_num_seqs"),
    "max_num_batched_tokens": ("engine", "max_num_batched_tokens"),
    "max_model_len": ("engine", "max_model_len"), "block_size": ("engine", "block_size"),
    "num_gpu_blocks": ("engine", "num_gpu_blocks"),
    "long_prefill_token_threshold": ("engine", "long_prefill_token_threshold"),
    "chunked_prefill": ("engine", "enable_chunked_prefill"),
    "prefix_caching": ("engine", "enable_prefix_caching"), "scheduling": ("engine", "scheduling"),
    "scheduler_profile": ("engine", "scheduler_profile"), "usage_context": ("engine", "usage_context"),
    "performance_mode": ("engine", "performance_mode"),
    "stop_string_detection": ("engine", "stop_string_detection"),
    "workload": ("workload", "kind"), "rate": ("workload", "rate"),
    "num_requests": ("workload", "num_requests"), "lengths": ("workload", "lengths"),
    "cv": ("workload", "cv"), "num_users": ("workload", "num_users"),
    "max_tokens": ("workload", "max_tokens"), "shared_prefix_len": ("workload", "shared_prefix_len"),
    "ignore_eos": ("workload", "ignore_eos"),
    "trace": ("workload", "path"), "trace_format": ("workload", "format"),
    "target_rate": ("workload", "target_rate"),
    "slo_ttft": ("slo", "ttft_s"), "slo_tpot": ("slo", "tpot_s"), "slo_e2e": ("slo", "e2e_s"),
    "client_ttft": ("client", "ttft_s"), "client_per_token": ("client", "per_token_s"),
}
GOODPUT_NAMES = {"ttft": "slo_ttft", "tpot": "slo_tpot", "e2el": "slo_e2e"}


def duration(text: str) -> float:
    """'0.5', '0.5s' or '500ms' -> seconds."""
    value = text.strip().lower()
    scale = 1e-3 if value.endswith("ms") else 1.0
    try:
        return float(value.removesuffix("ms").removesuffix("s")) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 0.5, 0.5s, 500ms)") from None


def goodput_pair(text: str) -> tuple[str, float]:
    """vllm bench serve's --goodput item 'ttft:500' (milliseconds) -> ('slo_ttft', 0.5 seconds)."""
    name, _, value = text.partition(":")
    if name not in GOODPUT_NAMES:
        raise argparse.ArgumentTypeError(f"{text!r}: the metric must be one of {', '.join(GOODPUT_NAMES)}")
    try:
        return GOODPUT_NAMES[name], float(value) / 1e3
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY:MILLISECONDS, e.g. ttft:500") from None


def add_config_flags(p: argparse.ArgumentParser) -> None:
    """The flags that change a SimulationConfig (shared with other subcommands)."""
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML file with the whole setup")
    p.add_argument("--deployment", type=Path, metavar="FILE", dest="deployment_file",
                   help="TOML deployment file ([deployment] and [engine], e.g. from servesim calibrate "
                   "--from-run), applied over --config; flags still win")
    g = p.add_argument_group("deployment")
    g.add_argument("--model", help="catalog model (or its Hugging Face id), e.g. llama-3.1-8b (the default),"
                                   " qwen2.5-7b, llama-3.1-70b; or the path of a model's config.json")
    g.add_argument("--gpu", help="catalog GPU, e.g. h100 (the default), a100, h200, l40s, mi300x, or the path of a"
                                 " JSON file of another GPU's datasheet figures (docs/cost_model.md)")
    g.add_argument("--tensor-parallel-size", "-tp", "--tp", dest="tp", type=int, metavar="N",
                   help="GPUs per replica (default 1; alias --tp)")
    g.add_argument("--data-parallel-size", "-dp", dest="dp", type=int, metavar="N",
                   help="DP ranks, each its own engine and KV cache (vLLM's flag; a MoE model with "
                        "--enable-expert-parallel, TP 1)")
    g.add_argument("--gpu-memory-utilization", type=float, metavar="F",
                   help="fraction of GPU memory vLLM may use (default 0.9)")
    g.add_argument("--cost-model", choices=("roofline", "linear"), help="step-time model (default roofline)")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="schedule each step before the previous one's tokens are applied, as vLLM's "
                   "--async-scheduling (default: the scheduler profile's, on); the CPU time then hides "
                   "behind the GPU time unless --no-cpu-gpu-overlap")
    g.add_argument("--cpu-gpu-overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="step time max(GPU, CPU) instead of GPU + CPU (default: follow async scheduling)")
    g.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), help="KV cache precision (vLLM's flag)")
    g.add_argument("--enable-expert-parallel", action="store_true", default=None,
                   help="shard a MoE model's experts over the TP ranks (vLLM's flag)")
    g.add_argument("--interconnect", choices=("auto", "nvlink", "pcie"),
                   help="the host's GPU link (default auto: the GPU catalog's); prices the collectives")
    g.add_argument("--clocks", choices=("burst", "sustained"),
                   help="burst (default): the kernel tables' clocks; sustained: compute at the clock a GPU's "
                   "power cap holds under compute-heavy load (measured on H100 SXM, H200)")
    g.add_argument("--calibration", metavar="NAME", help="kernel calibration: default, a shipped variant "
                   "(e.g. rtx-pro-6000@vllm-0.19) or a calibration JSON file")
    g = p.add_argument_group("engine")
    g.add_argument("--policy", help="scheduling policy (default vllm)")
    for flags, dest, what in ((("--max-num-seqs",), None, "requests in one batch (default: vLLM's for the GPU "
                               "and --usage-context; H100, vllm serve: 1024)"),
                              (("--max-num-batched-tokens",), None, "token budget of one step (default: "
                               "vLLM's for the GPU and --usage-context; H100: 8192, A100: 2048)"),
                              (("--max-model-len",), None, "longest prompt + output (default: the model's; "
                               "auto or -1: the longest the KV cache holds, where less; 32K = 32768)"),
                              (("--block-size",), None, "tokens per KV block (default 16)"),
                              (("--num-gpu-blocks-override", "--num-gpu-blocks"), "num_gpu_blocks",
                               "KV-cache size in blocks (default: sized from model and GPU)"),
                              (("--long-prefill-token-threshold",), None,
                               "cap on one request's prefill chunk (default 0: no cap)")):
        kind = {"--max-model-len": human_int_or_auto, "--max-num-batched-tokens": human_int}  # (vLLM's suffixes)
        g.add_argument(*flags, **({"dest": dest} if dest else {}), type=kind.get(flags[0], int), metavar="N",
                       help=what)
    g.add_argument("--usage-context", choices=USAGE_CONTEXTS,
                   help="the vLLM entry point requests come through: openai_api_server (vllm serve, the default: "
                        "refuses prompt + max_tokens above max_model_len), llm_class (offline LLM: cuts the output "
                        "there) or engine_context; it also picks unset --max-num-seqs and --max-num-batched-tokens")
    g.add_argument("--performance-mode", choices=PERFORMANCE_MODES,
                   help="vLLM's: balanced (default), throughput (doubles the defaulted --max-num-seqs and "
                        "--max-num-batched-tokens) or interactivity (CUDA graphs at every batch size up to 32)")
    g.add_argument("--enable-chunked-prefill", dest="chunked_prefill", action=argparse.BooleanOptionalAction,
                   default=None, help="split long prompts into chunks under the token budget "
                   "(default on; alias --no-chunked-prefill)")
    g.add_argument("--no-chunked-prefill", dest="chunked_prefill", action="store_const", const=False,
                   help=argparse.SUPPRESS)
    g.add_argument("--enable-prefix-caching", dest="prefix_caching", action=argparse.BooleanOptionalAction,
                   default=None, help="automatic prefix caching (default on; alias --no-prefix-caching)")
    g.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_const", const=False,
                   help=argparse.SUPPRESS)
    g.add_argument("--scheduling-policy", dest="scheduling", choices=("fcfs", "priority"),
                   help="order of waiting requests (default fcfs)")
    g.add_argument("--speculative-config", metavar="JSON",
                   help='speculative decoding as vLLM takes it, e.g. \'{"method": "eagle3", '
                        '"num_speculative_tokens": 3}\' (methods: eagle, eagle3, mtp, draft_model, ngram; a draft tree: "speculative_token_tree": "eagle1")')
    g.add_argument("--scheduler-profile", metavar="NAME",
                   help="vLLM release whose scheduler to follow: vllm (newest), vllm-0.33, vllm-0.19")
    g.add_argument("--stop-string-detection", choices=("frontend", "engine"),
                   help="where stop strings are found: frontend (vLLM V1: the request runs 1-2 more steps "
                   "and holds its KV until the front end's abort lands) or engine (it leaves at once); "
                   "default frontend for the vllm policy")
    _add_workload_flags(p)
    g = p.add_argument_group("SLO (for goodput and attainment)")
    for flag in ("ttft", "tpot", "e2e"):
        g.add_argument(f"--slo-{flag}", type=duration, metavar="T",
                       help=f"{flag.upper()} target, seconds or with a unit: 0.5, 500ms")
    g.add_argument("--goodput", nargs="+", type=goodput_pair, metavar="KEY:MS",
                   help="vllm bench serve's form of the same targets, in ms: ttft:500 tpot:50 e2el:20000")
    g = p.add_argument_group("HTTP client latency (results only; default off)")
    g.add_argument("--client-ttft", type=duration, metavar="T",
                   help="time an HTTP client adds to every request's first token (parsing, tokenisation, "
                   "streaming), e.g. 5ms; to compare with benchmarks measured over HTTP")
    g.add_argument("--client-per-token", type=duration, metavar="T",
                   help="time an HTTP client adds per later token (detokenising, streaming), e.g. 0.1ms")


def _add_workload_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=("poisson", "gamma", "closed_loop", "sessions"),
                   help="arrival process (default poisson); --trace selects trace replay")
    g.add_argument("--request-rate", "--rate", dest="rate", type=float, metavar="R",
                   help="arrival rate, requests/s (default 5; alias --rate)")
    g.add_argument("--num-prompts", "--num-requests", dest="num_requests", type=int, metavar="N",
                   help="requests to simulate (default 1000; alias --num-requests); with --workload sessions,"
                        " chat sessions")
    g.add_argument("--lengths", metavar="PRESET", help="length preset: sharegpt (the default), arxiv_summarization, "
                   "bwb_translation, azure_conv, azure_code, mooncake_conversation")
    g.add_argument("--cv", type=float, help="gamma arrivals: coefficient of variation")
    g.add_argument("--burstiness", type=float, metavar="B",
                   help="vllm bench serve's gamma shape: 1 is Poisson, below 1 burstier (cv = 1/sqrt(B))")
    g.add_argument("--num-users", type=int, metavar="N", help="closed loop: concurrent clients")
    g.add_argument("--max-tokens", type=int, metavar="N", help="every request's max_tokens: with --ignore-eos "
                   "(the default) each output is exactly N tokens, else at most N (never past --max-model-len)")
    g.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None,
                   help="generate each request's full output length (default on)")
    g.add_argument("--shared-prefix-len", type=int, metavar="N", help="tokens of a common prompt prefix")
    g.add_argument("--trace", metavar="PATH", help="replay a trace file (Azure, Mooncake, BurstGPT, CSV)")
    g.add_argument("--trace-format", metavar="FMT", help="azure, mooncake, burstgpt or generic (default: detected)")
    g.add_argument("--target-rate", type=float, metavar="R", help="rescale trace arrivals to R req/s")
    g.add_argument("--seed", type=int, help="random seed (default 0; same seed, same results)")


def config_from_args(args):
    """The SimulationConfig the flags describe (ConfigError on a bad value)."""
    from sim.api.simulator import SimulationConfig
    config = SimulationConfig.from_toml(args.config) if args.config else SimulationConfig()
    if getattr(args, "deployment_file", None):
        config = config.replace(**deployment_sections(args.deployment_file))
    for dest, seconds in getattr(args, "goodput", None) or ():
        given = getattr(args, dest, None)
        if given is not None and given != seconds:  # (two values for one target: neither may win silently)
            key = next(k for k, d in GOODPUT_NAMES.items() if d == dest)
            raise ConfigError("--goodput", f"{key}:{seconds * 1e3:g}", f"sets the {key} target that --"
                              f"{dest.replace('_', '-')} or another --goodput item sets to {given * 1e3:g} ms;"
                              " give each target once")
        setattr(args, dest, seconds)
    sections: dict[str, dict] = {}
    for dest, (section, name) in FIELDS.items():
        value = getattr(args, dest, None)
        if value is not None:
            sections.setdefault(section, {})[name] = value
    burstiness = getattr(args, "burstiness", None)
    if burstiness is not None and burstiness != 1.0:  # vLLM's gamma shape; 1.0 is its Poisson process
        low, high = (cv ** -2 for cv in reversed(GAMMA_CV))  # the gamma CVs kept, as shapes
        if not low <= burstiness <= high:
            raise ConfigError("--burstiness", burstiness, f"must be in [{low:g}, {high:g}] (gamma shape 1 / cv^2)")
        kind = sections.get("workload", {}).get("kind", config.workload.kind)
        kind = "trace" if getattr(args, "trace", None) else kind
        if kind not in ("poisson", "gamma"):
            raise ConfigError("--burstiness", burstiness, f"shapes open-loop arrivals (poisson or gamma); the "
                              f"workload is {kind!r}")
        sections.setdefault("workload", {}).update(kind="gamma", cv=burstiness ** -0.5)
    if getattr(args, "trace", None):
        sections["workload"]["kind"] = "trace"
    if getattr(args, "seed", None) is not None:
        sections["seed"] = args.seed
    if getattr(args, "speculative_config", None) is not None:
        from sim.core.speculative import SpeculativeConfig
        sections["speculative_config"] = SpeculativeConfig.from_json(args.speculative_config)
    try:
        return config.replace(**sections)
    except TypeError as exc:
        raise ConfigError("config", sections, str(exc)) from None


def deployment_sections(path: Path) -> dict:
    """The [deployment] and [engine] sections of a deployment file; any other section is an error."""
    from sim.api.sections import read_toml
    try:
        data = read_toml(path)
    except ConfigError as exc:  # name the flag's file, not --config's
        raise ConfigError("--deployment", exc.value, exc.reason) from None
    extra = sorted(set(data) - {"deployment", "engine"})
    if extra:
        raise ConfigError("--deployment", str(path), f"a deployment file holds [deployment] and [engine] "
                          f"only, not {extra}; use --config for a whole setup")
    return data


def warn_short_replay(args, config, replayed: int) -> None:
    """Say so when --num-prompts asks a trace or conversation file for more requests than it holds (vllm
    bench serve oversamples a dataset then; a replay keeps the file's own requests)."""
    asked = getattr(args, "num_requests", None)
    if asked and (config.workload.kind == "trace" or getattr(args, "conversations", None)) and replayed < asked:
        print(f"servesim: warning: --num-prompts {asked} asks for more requests than the file gives: all {replayed}"
              " of them were replayed", file=sys.stderr)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("run", help="simulate one configuration and print its summary",
                              description=DESCRIPTION, epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flags(p)
    add_topology_flags(p)
    add_output_flags(p)
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """Handler of `servesim run`."""
    from sim.api.progress import Progress
    from sim.api.report import format_summary
    from sim.api.results import summary_json
    from sim.api.table_io import check_output_folder
    config = config_from_args(args)
    metrics, percentiles = summary_options(args)
    if args.out:
        check_output_folder(args.out)
    check_result_path(args)
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    known = config.workload.kind in ("poisson", "gamma", "closed_loop") and not args.conversations
    progress = Progress(config.workload.num_requests if known else None) if show else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = simulate_from_args(config, args, progress)
    if progress is not None:
        progress.close()
    for warning in caught:
        print(f"servesim: warning: {warning.message}", file=sys.stderr)
    warn_short_replay(args, config, results.summary["num_requests"])
    if args.stop_string_detection and not any(isinstance(r, str) for r in results.requests["stop_reason"]):
        print(f"servesim: warning: --stop-string-detection={args.stop_string_detection} changed nothing: no request"
              " stopped on a stop string (servesim run's workloads carry none; pass simulate() RequestSpecs"
              " with sampling_params=SamplingParams(stop=[...]) from Python)", file=sys.stderr)
    if percentiles is not None:
        results = results.with_percentiles(percentiles)
    table = format_summary(results.summary, results.meta, metrics)
    save_outputs(args, results, table, status=show)
    print(json.dumps(summary_json(results.summary), indent=2) if args.json else table)
    return 0
