"""Simulator speed: the fast engine (leaps over quiet stretches) against the step-by-step reference.

Poisson arrivals. Scenarios with ShareGPT-like lengths, the vLLM (V1) policy and the linear cost model
(the loop is what is measured; the cost model's own price is in cost_model_speed.py):

- light:    2 req/s on a roomy KV cache (batches of ~6, long quiet decode stretches);
- busy:     5 req/s (batches of ~35);
- overload: 20 req/s on a small KV cache: a long queue and preemptions;

and the setup issue 15 measured (Azure conversation lengths, Llama-2-7B on A100 with the roofline cost
model, vLLM V0's policy, 128 sequences, 4096-token budget) at 4 req/s and at 20 req/s (about 2x its capacity).

For each it runs both engine modes alternately `--repeat` times (each mode first in every other turn, and
no run's records kept while the next runs) and reports the best CPU time of each (the machine may be
shared), the ratio, requests and output tokens per CPU-second, and checks that the
two modes' records are identical. `--baseline PATH` also times another checkout (e.g. the main branch
before this work) on the same scenarios in a subprocess, against this checkout in a subprocess too (a run
after others in one process is ~5-8% slower, so the in-process fast time is not compared with it).
`--scale` reports peak memory (max RSS of a fresh process) and time for 1k/10k/100k requests in fast
mode (`--scale 1000000` adds 1M; `--scale-scenario issue-light` runs another scenario; `--token-times on,runs,off` runs each point with each
`record_token_times` setting: every token time in an array, as runs, or none; `--no-token-times` is
`--token-times on,off`; `--via-simulate` builds what `simulate()` builds, `Results` and its summary,
instead of the numpy tables). `--scenarios ""` skips the comparison.

    python benchmarks/sim_speed.py [--requests 2000] [--repeat 3] [--baseline ../main] [--scale 100000]
                                   [--scale-from 1000] [--token-times on,runs,off] [--no-token-times]

For context, issue 15 measured Vidur's loop at about 840/3.6 = 230 requests per wall-second on a 10k-request
Azure-conversation run (servesim's step engine then: ~840 requests/s on that run).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

LINEAR = dict(lengths="sharegpt", policy="vllm", max_model_len=16384, max_num_batched_tokens=8192,
              max_num_seqs=256, roofline=False)
#: The issue's reference setup: Azure conversation lengths, Llama-2-7B on an A100 (roofline cost
#: model), vLLM V0's policy, 128 sequences, a 4096-token budget (KV size: ~7,500 blocks of 16 tokens).
ISSUE = dict(lengths="conversation", policy="vllm-v0", max_model_len=4096, max_num_batched_tokens=4096,
             max_num_seqs=128, roofline=True)
SCENARIOS = {  # name: (arrival rate req/s, KV blocks, setup)
    "light": (2.0, 30_000, LINEAR),
    "busy": (5.0, 30_000, LINEAR),
    "overload": (20.0, 6_000, LINEAR),
    "issue-light": (4.0, 7_500, ISSUE),
    "issue-2x": (20.0, 7_500, ISSUE),
    "busy-no-prefix-cache": (5.0, 30_000, dict(LINEAR, prefix_caching=False)),
}


def run_once(scenario: str, num_requests: int, mode: str | None, token_times: bool | str = True):
    """(CPU seconds, records) of one simulation; mode None: the checkout's default engine;
    `token_times`: the `record_token_times` setting (True, False or "runs")."""
    from sim.core.config import EngineConfig
    from sim.core.cost import LinearCostModel
    from sim.engine.simulation import run_engine
    from workloads import poisson_workload

    rate, blocks, setup = SCENARIOS[scenario]
    kwargs = {} if mode is None else {"mode": mode}
    if token_times is not True:
        kwargs["record_token_times"] = token_times
    if not setup.get("prefix_caching", True):
        kwargs["enable_prefix_caching"] = False
    config = EngineConfig(num_gpu_blocks=blocks, max_model_len=setup["max_model_len"], policy=setup["policy"],
                          max_num_batched_tokens=setup["max_num_batched_tokens"],
                          max_num_seqs=setup["max_num_seqs"], **kwargs)
    if setup["roofline"]:
        from kernels_cost_model.builder import make_cost_model
        cost_model = make_cost_model("llama-2-7b", "a100-sxm-80gb", async_scheduling=config.is_async,
                                     max_num_seqs=config.max_num_seqs)
    else:
        cost_model = LinearCostModel()
    workload = poisson_workload(rate=rate, num_requests=num_requests, lengths=setup["lengths"])
    start = time.process_time()
    records = run_engine(workload, config, cost_model, seed=0)
    return time.process_time() - start, records


def fingerprint(records) -> str:
    """A digest of everything the two modes must agree on (every record's repr), so that no copy of
    one run's records is held while the next runs."""
    digest = hashlib.sha256()
    for table in (records.steps, records.requests):
        for name, column in table.columns().items():
            digest.update(f"{name}={list(column)!r};".encode())
    for times in records.requests.times():
        digest.update(b"-" if times is None else repr(list(times)).encode())
    digest.update(repr(records.end_time).encode())
    return digest.hexdigest()


def compare(scenario: str, num_requests: int, repeat: int, baseline: str | None) -> dict:
    best = {"step": float("inf"), "fast": float("inf"), "baseline": float("inf"), "fresh": float("inf")}
    prints = {}
    for turn in range(repeat):
        for mode in ("step", "fast") if turn % 2 == 0 else ("fast", "step"):  # (neither always runs second)
            cpu, records = run_once(scenario, num_requests, mode)
            best[mode] = min(best[mode], cpu)
            prints[mode] = fingerprint(records)
            tokens, steps = sum(records.requests.num_output_tokens), len(records.steps)
            preempted = sum(records.requests.num_preemptions)
            del records  # (the next run starts without this one's records)
        if baseline:  # both trees in fresh processes (a run after others in one process is slower)
            best["baseline"] = min(best["baseline"], _baseline_cpu(baseline, scenario, num_requests))
            best["fresh"] = min(best["fresh"], _baseline_cpu(os.path.dirname(_here()), scenario, num_requests))
    return {"scenario": scenario, "requests": num_requests, "steps": steps, "output_tokens": tokens,
            "preemptions": preempted, "identical": prints["step"] == prints["fast"], **best}


def _baseline_cpu(path: str, scenario: str, num_requests: int) -> float:
    code = (f"import sys; sys.path.insert(0, {os.path.abspath(path)!r}); sys.path.insert(0, {_here()!r});"
            f"import sim_speed as b; print(b.run_once({scenario!r}, {num_requests}, None)[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.abspath(path))
    return float(out.stdout.strip().splitlines()[-1])


def _here() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def scale_point(num_requests: int, mode: str, token_times: bool | str = True, via_simulate: bool = False,
                scenario: str = "busy") -> dict:
    """Run in a fresh process: wall time, CPU time and max RSS of one `scenario` run with tables: the
    benchmark's numpy tables, or (`via_simulate`) what `simulate()` builds, `Results.from_records` and
    its summary ('rss_engine': max RSS when the engine had finished, before any table)."""
    build = "tables = b.results(rec)" if via_simulate else "tables = b.tables(rec)"
    # pandas' own memory counts as the engine's; simulate() fixes the mmap threshold before its engine
    imports = (f"import sim.api.results, sim.api.memory; sim.api.memory.keep_large_blocks_apart({num_requests});"
               if via_simulate else "")
    code = (f"import sys, json, time, resource; sys.path.insert(0, {_here()!r}); {imports}"
            f"import sim_speed as b; rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
            f"t = time.perf_counter(); cpu, rec = b.run_once({scenario!r}, {num_requests}, {mode!r}, {token_times!r});"
            f"rss_engine = rss(); c = time.process_time(); {build}; table_cpu = time.process_time() - c;"
            f"wall = time.perf_counter() - t;"
            f"print(json.dumps({{'cpu': cpu, 'wall': wall, 'rss': rss(), 'rss_engine': rss_engine,"
            f"'table_cpu': table_cpu,"
            f"'tokens': int(sum(rec.requests.num_output_tokens)), 'steps': len(rec.steps)}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(_here()))
    return json.loads(out.stdout.strip().splitlines()[-1])


def results(records):
    """What `simulate()` makes of the records: `Results` and its summary (the client latency off;
    `scale_point` fixes the mmap threshold before the engine, as `simulate()` does)."""
    from sim.api.memory import release_freed_memory
    from sim.api.results import Results
    release_freed_memory()
    res = Results.from_records(records)
    return res, dict(res.summary)


def tables(records):
    """The run's request and step tables as numpy columns (what a user's analysis reads): typed
    columns are viewed where they lie (no copy, their own widths), lists of labels become object
    arrays of the same strings."""
    import numpy as np
    from array import array

    def column(values):
        if isinstance(values, array):
            return np.frombuffer(values, dtype=values.typecode)
        if values and all(isinstance(v, (bool, int)) for v in values[:1]):
            return np.asarray(values)
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    steps = {k: column(v) for k, v in records.steps.columns().items()}
    reqs = {k: column(v) for k, v in records.requests.columns().items()}
    return reqs, steps


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--baseline", help="another checkout to time on the same scenarios")
    parser.add_argument("--scale", type=int, default=0, help="largest request count of the scaling table")
    parser.add_argument("--scale-from", type=int, default=1000, help="smallest request count of the scaling table")
    parser.add_argument("--scale-scenario", default="busy", choices=sorted(SCENARIOS),
                        help="scaling table: the scenario run at each size")
    parser.add_argument("--token-times", default="on",
                        help="scaling table: record_token_times settings to run each point with (on,runs,off)")
    parser.add_argument("--no-token-times", action="store_true",
                        help="scaling table: also run each point without per-token times (adds off)")
    parser.add_argument("--via-simulate", action="store_true",
                        help="scaling table: build simulate()'s Results and summary instead of numpy tables")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    scenarios = [name for name in args.scenarios.split(",") if name]
    if scenarios:
        print(f"{args.requests} requests per scenario, best CPU time of {args.repeat}")
    for scenario in scenarios:
        r = compare(scenario, args.requests, args.repeat, args.baseline)
        line = (f"{scenario:9s} {r['steps']:7d} steps {r['preemptions']:5d} preemptions | step {r['step']:6.2f}s "
                f"fast {r['fast']:6.2f}s  x{r['step'] / r['fast']:.2f} | fast: "
                f"{r['requests'] / r['fast']:8,.0f} req/cpu-s {r['output_tokens'] / r['fast']:10,.0f} tok/cpu-s"
                f" | identical: {r['identical']}")
        if args.baseline:
            line += f" | baseline {r['baseline']:6.2f}s vs {r['fresh']:6.2f}s  x{r['baseline'] / r['fresh']:.2f}"
        print(line)
    settings = {"on": True, "runs": "runs", "off": False}
    chosen = [settings[name] for name in args.token_times.split(",")]
    if args.no_token_times and False not in chosen:
        chosen.append(False)
    n = args.scale_from
    while args.scale and n <= args.scale:
        for token_times in chosen:
            p = scale_point(n, "fast", token_times, args.via_simulate, args.scale_scenario)
            label = {True: "", "runs": ", token times as runs", False: ", no token times"}[token_times]
            built = "Results + summary" if args.via_simulate else "tables built"
            print(f"scale {n:>9,d} requests ({args.scale_scenario}, {built}{label}): {p['wall']:7.1f} wall-s {p['cpu']:7.1f} "
                  f"cpu-s {n / p['cpu']:8,.0f} req/cpu-s, max RSS {p['rss'] / 1024:7.0f} MiB "
                  f"(engine done: {p['rss_engine'] / 1024:.0f} MiB; tables {p['table_cpu']:.1f} cpu-s), "
                  f"{p['steps']:,d} steps, {p['tokens']:,d} output tokens", flush=True)
        n *= 10


if __name__ == "__main__":
    main()
