"""servesim against vLLM serving figures published by others (an external check; nothing fitted to them).

    python benchmarks/published_check.py [--csv benchmarks/data/published_vllm_figures.csv] [--max-prompts 300]
                                         [--ramp-up-s 0]

Reads the figures' CSV (one published number a row, with its source), runs servesim on each row's setup
from the shipped calibrations, and prints published vs simulated, the signed error (sim / published - 1)
and the median |error| per metric. A row whose model or GPU servesim does not know is skipped with the
reason. Rows map to workloads as the sources ran them:

- `batch N` (vLLM's latency test): N requests at once, fixed lengths, offline entry point; the figure is
  their mean end-to-end latency.
- `offline` (vLLM's throughput test): every prompt at t = 0, offline entry point.
- `concurrency C` (`vllm bench serve --max-concurrency C --request-rate inf`): C closed-loop clients.

ShareGPT rows draw lengths from clipped lognormals whose clipped means are the token totals a published
`vllm bench serve` ShareGPT run reports (vllm-project/vllm#18566: 229,711 input and 203,068 output
tokens over 1,000 prompts); the spread (sigma) and the clipping to vLLM's sampling limits are assumed.
Its requests take the distributions' evenly spaced quantiles (so 200 requests hold those means), prompt and
output paired at random.
Deterministic: seed 0 everywhere.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path
from statistics import NormalDist, median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import workloads as w  # noqa: E402
from sim import SamplingParams, SimulationConfig, simulate  # noqa: E402
from workloads import RequestSpec  # noqa: E402

DEFAULT_CSV = Path(__file__).resolve().parent / "data" / "published_vllm_figures.csv"
SHAREGPT_MEAN_TOKENS = (229_711 / 1000, 203_068 / 1000)  # vllm-project/vllm#18566, Llama-3.1 tokenizer
SHAREGPT_SIGMA = 1.0        # assumed spread of log lengths
SHAREGPT_MAX_PROMPT = 1024  # vLLM's ShareGPT sampling drops longer prompts
SHAREGPT_MAX_OUTPUT = 1024  # and prompt + output over 2048; clip each side at 1024 (assumed)
SUMMARY_KEY = {"mean_latency": "mean_e2el_ms", "request_throughput": "request_throughput",
               "mean_ttft": "mean_ttft_ms"}


def read_rows(path: Path = DEFAULT_CSV) -> list[dict]:
    """The published figures, one dict a row (value as float, tp and num_prompts as int)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["value"], r["tp"], r["num_prompts"] = float(r["value"]), int(r["tp"]), int(r["num_prompts"])
    return rows


def clipped_mean(mu: float, high: int) -> float:
    """Mean of exp(Normal(mu, SHAREGPT_SIGMA)) clipped to [4, high], over 2,000 normal quantiles."""
    z = [NormalDist().inv_cdf((i + 0.5) / 2000) for i in range(2000)]
    return sum(min(max(math.exp(mu + SHAREGPT_SIGMA * x), 4), high) for x in z) / len(z)


def lognormal(mean: float, high: int) -> w.LogNormal:
    """The lognormal of the assumed sigma, clipped to [4, high] tokens, whose clipped mean is `mean`
    (mu by bisection)."""
    lo, hi = 0.0, math.log(high)
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if clipped_mean(mid, high) < mean else (lo, mid)
    return w.LogNormal((lo + hi) / 2, SHAREGPT_SIGMA, low=4, high=high)


def quantile_lengths(dist: w.LogNormal, n: int) -> np.ndarray:
    """n lengths at the distribution's (i + 0.5) / n quantiles: a sample whose mean is the mean's."""
    return dist.from_normal(np.array([NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)]))


def sharegpt_requests(n: int, seed: int = 0) -> list[RequestSpec]:
    """n requests at t = 0 with ShareGPT-like lengths: prompt and output quantiles, paired at random."""
    rng = np.random.default_rng(seed)
    prompts = quantile_lengths(lognormal(SHAREGPT_MEAN_TOKENS[0], SHAREGPT_MAX_PROMPT), n)
    outputs = rng.permutation(quantile_lengths(lognormal(SHAREGPT_MEAN_TOKENS[1], SHAREGPT_MAX_OUTPUT), n))
    return [RequestSpec(0.0, rng.integers(1_000, 30_000, int(p)), output_len=None,
                        sampling_params=SamplingParams(max_tokens=int(o), ignore_eos=True), request_id=f"req-{i}")
            for i, (p, o) in enumerate(zip(prompts, outputs))]


def load(row: dict) -> tuple[str, int]:
    """('batch' | 'offline' | 'concurrency', clients at once) from request_rate_or_concurrency."""
    kind, _, n = row["request_rate_or_concurrency"].partition(" ")
    if kind not in ("batch", "offline", "concurrency"):
        raise ValueError(f"request_rate_or_concurrency={row['request_rate_or_concurrency']!r}: unknown load")
    return kind, int(n) if n else row["num_prompts"]


def workload_for(row: dict, max_prompts: int, ramp_up_s: float = 0.0):
    """The requests as the source sent them: ShareGPT rows all at t = 0, fixed-length rows as `users`
    closed-loop clients (a concurrency row: at most `max_prompts` requests, the clients starting together
    or spread over `ramp_up_s` seconds)."""
    kind, users = load(row)
    if row["dataset"] == "sharegpt":
        return sharegpt_requests(row["num_prompts"])
    n = min(row["num_prompts"], max_prompts) if kind == "concurrency" else row["num_prompts"]
    fixed = w.Independent(w.Fixed(int(row["input_len"])), w.Fixed(int(row["output_len"])))
    ramp = ramp_up_s if kind == "concurrency" else 0.0  # a batch row's requests go in together
    return w.ClosedLoopClients(users, max(n, users), lengths=fixed, ramp_up_s=ramp)


def config_for(row: dict, clocks: str = "burst") -> SimulationConfig:
    """The deployment and engine of a row: vLLM's defaults for its entry point, seed 0."""
    entry = "openai_api_server" if load(row)[0] == "concurrency" else "llm_class"
    return SimulationConfig(seed=0).replace(
        deployment={"model": row["model"], "gpu": row["gpu"], "tensor_parallel_size": row["tp"], "clocks": clocks},
        engine={"usage_context": entry})


def check_row(row: dict, max_prompts: int, ramp_up_s: float = 0.0, clocks: str = "burst") -> dict:
    """The row with `simulated`, `error` and the mean tokens drawn (`drawn`) added, or `skipped` with
    the reason."""
    try:
        summary = simulate(config_for(row, clocks), workload=workload_for(row, max_prompts, ramp_up_s)).summary
    except Exception as e:  # noqa: BLE001 - an unknown model or GPU is reported, not fatal
        return dict(row, skipped=f"{type(e).__name__}: {e}")
    sim, n = float(summary[SUMMARY_KEY[row["metric"]]]), summary["num_requests"]
    drawn = f"{summary['total_input_tokens'] / n:.0f}/{summary['total_output_tokens'] / n:.0f}"
    return dict(row, simulated=sim, error=sim / row["value"] - 1.0, drawn=drawn, ran=n)


def median_errors(checked: list[dict]) -> dict[str, float]:
    """metric -> median |error| over the rows that ran."""
    by_metric: dict[str, list[float]] = {}
    for r in checked:
        if "error" in r:
            by_metric.setdefault(r["metric"], []).append(abs(r["error"]))
    return {m: median(v) for m, v in by_metric.items()}


def source_label(url: str) -> str:
    """A short name for a source URL."""
    return url.split("//", 1)[-1].split("/", 1)[0] + ("/" + url.rstrip("/").rsplit("/", 1)[-1])[:28]


def table(checked: list[dict]) -> str:
    """Markdown table of published vs simulated."""
    lines = ["| source | model | GPU | TP | load | requests | mean in/out | metric | published | servesim | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in checked:
        sim = f"{r['simulated']:.4g}" if "error" in r else "skipped"
        err = f"{r['error'] * 100:+.1f} %" if "error" in r else r["skipped"]
        lines.append(f"| {source_label(r['source_url'])} | {r['model']} | {r['gpu']} | {r['tp']} | "
                     f"{r['request_rate_or_concurrency']} | {r.get('ran', '')} | {r.get('drawn', '')} | {r['metric']} ({r['unit']}) | {r['value']:.4g} | "
                     f"{sim} | {err} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(DEFAULT_CSV), help="the published figures")
    ap.add_argument("--max-prompts", type=int, default=300,
                    help="cap on a concurrency row's requests (offline rows run all theirs)")
    ap.add_argument("--ramp-up-s", type=float, default=0.0,
                    help="spread the closed-loop clients' first requests over S seconds (default 0: together, "
                         "as vllm bench serve starts them); a sensitivity check, the sources give no spread")
    ap.add_argument("--clocks", choices=("burst", "sustained"), default="burst",
                    help="the GPUs' clocks (deployment.clocks; sustained: at the power cap, where measured)")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    checked = [check_row(r, args.max_prompts, args.ramp_up_s, args.clocks) for r in read_rows(Path(args.csv))]
    print(table(checked))
    print()
    for metric, err in median_errors(checked).items():
        n = sum(1 for r in checked if r["metric"] == metric and "error" in r)
        print(f"median |error| {metric}: {err * 100:.1f} % over {n} rows")
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
