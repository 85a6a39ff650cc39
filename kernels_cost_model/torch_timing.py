"""Timing one kernel call with PyTorch: on CUDA as CUDA-graph replays over DRAM-cold copies, on CPU the
fastest of plain calls (torch_backend.py says why each)."""
from __future__ import annotations

import math
import statistics
import time
import warnings

GRAPH_CALLS = 16
"""Calls captured in one CUDA graph (at least; more where more copies rotate)."""
MAX_COPIES = 128
"""Most copies of a point's operands rotated through, so that a small point still reads from DRAM."""


def cpu_timer(warmup: int, repeats: int):
    """measure(make, cold_bytes) -> the fastest of `repeats` calls of make()'s function, after warm-up."""
    def measure(make, cold_bytes: float = 0.0) -> float:
        fn = make()
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return min(samples)
    return measure


def rotated_copies(l2_bytes: int, cold_bytes: float) -> int:
    """Copies of a point's operands to rotate through so that each call reads `cold_bytes` from DRAM:
    together at least twice the L2. One where nothing need come from DRAM (an activation the previous
    kernel just wrote)."""
    if cold_bytes <= 0:
        return 1
    return int(min(MAX_COPIES, max(1, math.ceil(2 * l2_bytes / cold_bytes))))


def cuda_timer(torch, device: str, warmup: int, repeats: int):
    """measure(make, cold_bytes) -> seconds of one call: the median over `repeats` CUDA-graph replays, each
    of at least GRAPH_CALLS calls rotating over rotated_copies(L2, cold_bytes) functions from make()."""
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size

    def measure(make, cold_bytes: float = 0.0) -> float:
        fns = [make() for _ in range(rotated_copies(l2_bytes, cold_bytes))]
        calls = math.ceil(max(GRAPH_CALLS, len(fns)) / len(fns)) * len(fns)
        for fn in fns:
            for _ in range(warmup):
                fn()
        torch.cuda.synchronize()
        run = _captured(torch, fns, calls)
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / calls)
        return statistics.median(samples)
    return measure


def _captured(torch, fns: list, calls: int):
    """`calls` calls (rotating over `fns`) captured in one CUDA graph; back-to-back launches, with a
    warning (their launch gaps count), where a kernel cannot be captured."""
    def launches():
        for i in range(calls):
            fns[i % len(fns)]()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            launches()
    except RuntimeError as exc:
        torch.cuda.synchronize()
        warnings.warn(f"CUDA graph capture failed ({exc}); timing plain launches, launch gaps included",
                      stacklevel=3)
        return launches
    graph.replay()
    torch.cuda.synchronize()
    return graph.replay
