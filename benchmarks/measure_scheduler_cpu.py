"""Measure vLLM's own scheduler CPU time per engine step, by running batch size and scheduled tokens.

    VLLM_TARGET_DEVICE=cpu /work/vllmvenv/bin/python benchmarks/measure_scheduler_cpu.py \
        --out kernels_cost_model/data/scheduler_cpu.json

Drives vLLM's real V1 `Scheduler` (no GPU, a config-only tiny model; the same driver as
benchmarks/vllm_conformance.py) through steady states and times, per step, the engine core's CPU work
around the model: `schedule()` plus `update_from_output()` (which turns the sampled tokens into
per-request outputs, checks stop rules and frees finished requests), plus, where the installed vLLM
can build its CPU model runner without a model (0.19.1 and 0.33.0 can), the
runner's `_update_states` (the persistent input batch's per-step bookkeeping). Building the model
runner's output is the harness's part and is not timed; `_prepare_inputs` (its slot mapping is a
Triton kernel), sampling and the front end's detokenising are not measured here.

Two sweeps:
- decode: `n` running requests, each scheduling one token per step (no prefill), n = 1 .. 256;
- mixed: `n` decodes plus one new request whose whole prompt of `t` tokens is prefilled in the step
  (it then finishes, max_tokens=1), for the per-token cost of prefill tokens.

Times are the thread's CPU time (`time.thread_time_ns`, so other processes on a shared machine add
little), the median over `--steps` steps after warm-up. It fits `base + per_request x n +
per_token x tokens` by least squares (to the medians; `fit_p10` to the 10th percentiles, less
disturbed by other processes on a shared machine) and writes everything, with the vLLM version, the CPU model,
the date and the method, to `--out` (JSON).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.fidelity.conformance.vllm_trace import make_request, make_scheduler, vllm_version  # noqa: E402

CONFIG = {"max_model_len": 1 << 15, "max_num_seqs": 512, "max_num_batched_tokens": 8192,
          "long_prefill_token_threshold": 0, "enable_chunked_prefill": True, "async_scheduling": False,
          "scheduling": "fcfs", "block_size": 16, "enable_prefix_caching": True, "num_gpu_blocks": 1 << 16}
PROMPT = 128
DECODE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256)
MIXED = ((1, 512), (1, 2048), (32, 512), (32, 2048), (128, 512), (128, 2048), (128, 4096), (256, 2048))


def _spec(rid: str, prompt: list[int], max_tokens: int) -> dict:
    return {"id": rid, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stop_token_ids": [],
            "arrival": 0.0, "priority": 0}


def _update(sched, out):
    """The model's part: one token for every request that finished its prompt (not timed)."""
    from vllm.v1.outputs import ModelRunnerOutput
    req_ids = list(out.num_scheduled_tokens)
    tokens = [[] if sched.requests[r].is_prefill_chunk else [7] for r in req_ids]
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                             sampled_token_ids=tokens)


_distributed_ready = False


def make_runner(sched):
    """vLLM's model runner (CPU flavour, no model loaded) for its `_update_states` (the input batch's
    per-step bookkeeping), or None where this vLLM cannot build one without a device."""
    global _distributed_ready
    import copy
    try:
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
        with set_current_vllm_config(sched.vllm_config):
            if not _distributed_ready:
                init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                             distributed_init_method="tcp://127.0.0.1:29517")
                ensure_model_parallel_initialized(1, 1)
                _distributed_ready = True
            runner = CPUModelRunner(sched.vllm_config, torch.device("cpu"))
    except Exception as exc:  # noqa: BLE001 - a release whose runner needs a device: scheduler only
        print(f"model runner not measured: {type(exc).__name__}: {exc}"[:200], flush=True)
        return None
    config = copy.copy(sched.kv_cache_config)
    config.kv_cache_groups = []  # no attention backends: skip the batch reordering they ask for
    runner.kv_cache_config = config
    return runner


class _Bench:
    def __init__(self, n: int, runner: bool = True):
        self.sched = make_scheduler(CONFIG)
        self.runner = make_runner(self.sched) if runner else None
        self.counter = 0
        for _ in range(n):
            self.add(PROMPT, 1 << 14)
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in self.sched.requests.values()):
            self.step()

    def add(self, length: int, max_tokens: int) -> None:
        self.counter += 1  # distinct prompts: no prefix-cache hits
        prompt = [(self.counter * 7919 + i) % 31000 + 100 for i in range(length)]
        self.sched.add_request(make_request(_spec(f"r{self.counter}", prompt, max_tokens),
                                            CONFIG["block_size"], CONFIG["max_model_len"]))

    def step(self) -> tuple[int, int, int, int]:
        """One step; (scheduler CPU ns, model runner update CPU ns, requests, tokens scheduled)."""
        t0 = time.thread_time_ns()
        out = self.sched.schedule()
        t1 = time.thread_time_ns()
        if self.runner is not None:
            self.runner._update_states(out)
        t2 = time.thread_time_ns()
        mro = _update(self.sched, out)
        t3 = time.thread_time_ns()
        self.sched.update_from_output(out, mro)
        t4 = time.thread_time_ns()
        return (t1 - t0) + (t4 - t3), t2 - t1, len(out.num_scheduled_tokens), out.total_num_scheduled_tokens


def measure(n: int, prefill: int, steps: int, warmup: int, runner: bool = True) -> dict:
    bench = _Bench(n, runner)
    times, sched, update, shape = [], [], [], None
    for i in range(warmup + steps):
        if prefill:
            bench.add(prefill, 1)
        s_ns, u_ns, reqs, toks = bench.step()
        if i >= warmup:
            times.append(s_ns + u_ns)
            sched.append(s_ns)
            update.append(u_ns)
            shape = (reqs, toks)
    return {"running": n, "prefill_tokens": prefill, "scheduled_requests": shape[0], "scheduled_tokens": shape[1],
            "median_us": statistics.median(times) / 1e3, "p10_us": _quantile(times, 0.1) / 1e3,
            "p90_us": _quantile(times, 0.9) / 1e3, "scheduler_median_us": statistics.median(sched) / 1e3,
            "runner_update_median_us": statistics.median(update) / 1e3 if bench.runner is not None else None,
            "steps": steps}


def _quantile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fit(points: list[dict], key: str = "median_us") -> dict:
    """Least squares `median_us = base + per_request x requests + per_token x tokens` (numpy), each
    figure >= 0: a term that comes out negative is dropped and the rest refitted."""
    import numpy as np
    a = np.array([[1.0, p["scheduled_requests"], p["scheduled_tokens"]] for p in points])
    y = np.array([p[key] for p in points])
    keep = [0, 1, 2]
    while True:
        coef = np.zeros(3)
        coef[keep] = np.linalg.lstsq(a[:, keep], y, rcond=None)[0]
        if (coef >= 0).all():
            break
        keep.remove(int(np.argmin(coef)))
    pred = a @ coef
    return {"base_us": float(coef[0]), "per_request_us": float(coef[1]), "per_token_us": float(coef[2]),
            "median_abs_rel_error": float(np.median(np.abs(pred - y) / y))}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    parser.add_argument("--no-runner", action="store_true", help="time the scheduler only")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    points = []
    for n, prefill in [(n, 0) for n in DECODE_SIZES] + list(MIXED):
        point = measure(n, prefill, args.steps, args.warmup, not args.no_runner)
        points.append(point)
        runner = point["runner_update_median_us"]
        print(f"running {n:4d} prefill {prefill:5d}: {point['scheduled_requests']:4d} requests "
              f"{point['scheduled_tokens']:5d} tokens  {point['median_us']:8.1f} us "
              f"(p10 {point['p10_us']:.1f}, p90 {point['p90_us']:.1f}; scheduler {point['scheduler_median_us']:.1f}, "
              f"runner update {'-' if runner is None else f'{runner:.1f}'})", flush=True)
    with_runner = points[0]["runner_update_median_us"] is not None
    result = {
        "what": ("vLLM V1 CPU time per step: Scheduler.schedule() + update_from_output()"
                 + (" + the model runner's _update_states (input batch bookkeeping)" if with_runner else "")),
        "includes_model_runner_update": with_runner,
        "vllm_version": vllm_version(), "python": platform.python_version(), "cpu_model": cpu_model(),
        "date": datetime.date.today().isoformat(),
        "method": ("benchmarks/measure_scheduler_cpu.py: vLLM's real Scheduler on a config-only tiny model "
                   "(VLLM_TARGET_DEVICE=cpu, no GPU), time.thread_time_ns around schedule(), "
                   "update_from_output() and, where this vLLM builds one without a device, the CPU model "
                   "runner's _update_states; median of steps after warm-up; not timed: _prepare_inputs "
                   "(its slot mapping is a Triton kernel), sampling, detokenising"),
        "load_average_1min": os.getloadavg()[0],
        "config": CONFIG, "prompt_tokens": PROMPT, "points": points, "fit": fit(points),
        "fit_p10": fit(points, "p10_us"),
    }
    f = result["fit"]
    print(f"fit: {f['base_us']:.1f} us + {f['per_request_us']:.2f} us/request + {f['per_token_us']:.4f} us/token "
          f"(median |error| {100 * f['median_abs_rel_error']:.1f} %)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
