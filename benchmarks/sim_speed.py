"""Simulator speed: requests and output tokens simulated per wall-second, and peak memory.

10,000 ShareGPT-like requests, Poisson arrivals, vLLM policy, linear cost model (the step loop is
what is measured; the cost model's own price is measured in cost_model_speed.py). Also times a
whole 1,000-request run including building its result tables.

    python benchmarks/sim_speed.py [--requests 10000] [--rate 20]
"""
from __future__ import annotations

import argparse
import time
import tracemalloc

from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.engine.simulation import run_engine
from workloads import poisson_workload


def measure(num_requests: int, rate: float, trace_memory: bool) -> dict:
    workload = poisson_workload(rate=rate, num_requests=num_requests, lengths="sharegpt")
    config = EngineConfig(num_gpu_blocks=30_000, max_model_len=16384, max_num_batched_tokens=8192)
    if trace_memory:
        tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    records = run_engine(workload, config, LinearCostModel(), seed=0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = tracemalloc.get_traced_memory()[1] if trace_memory else 0
    if trace_memory:
        tracemalloc.stop()
    tokens = sum(records.requests.num_output_tokens)
    return {"requests": num_requests, "steps": len(records.steps), "output_tokens": tokens,
            "wall_s": wall, "cpu_s": cpu, "simulated_s": records.end_time, "peak_mib": peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    r = measure(args.requests, args.rate, trace_memory=False)
    print(f"{r['requests']} requests, {r['steps']} steps, {r['output_tokens']} output tokens, "
          f"{r['simulated_s']:.0f} simulated s in {r['wall_s']:.2f} wall s")
    print(f"  {r['requests'] / r['wall_s']:,.0f} requests/wall-s, "
          f"{r['output_tokens'] / r['wall_s']:,.0f} output tokens/wall-s, "
          f"{r['steps'] / r['wall_s']:,.0f} steps/wall-s")
    print(f"  by process CPU time (less sensitive to other load): "
          f"{r['output_tokens'] / r['cpu_s']:,.0f} output tokens/cpu-s")
    m = measure(args.requests, args.rate, trace_memory=True)
    print(f"  peak traced memory {m['peak_mib']:.0f} MiB ({m['peak_mib'] * 2**20 / args.requests / 1024:.1f} KiB/request)")


if __name__ == "__main__":
    main()
