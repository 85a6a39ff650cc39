"""Measure KV block copies between GPU memory and pinned host memory, as vLLM's CPU offloading moves them.

    python benchmarks/measure_host_copies.py --gpu h200 --out measured/      # on a CUDA machine

Writes `<out>/<gpu>-host-copies.csv` and `<out>/<gpu>-host-copies.env.json` (device, driver, PCIe link,
software, date). Rows: `method, direction, copy_bytes, copies, seconds` (GPU time from CUDA events, median
of the repeats; the stream is held back while the host issues, so this is the copy engine's time alone),
`issue_s` (host time to issue the copies, Python and ctypes included) and `bytes_per_s`. Methods:

- `single`: one copy of `copy_bytes` (the link's curve by size);
- `per_block`: `copies` separate cudaMemcpyAsync calls of `copy_bytes` each between scattered blocks, as
  vLLM 0.19's `swap_blocks` issues one per block and KV tensor (issued here from Python through ctypes;
  `issue_s` says whether the host or the copy engine bound);
- `batch`: the same copies in one cuMemcpyBatchAsync call, as vLLM 0.33's simple CPU offload issues them
  (left out where the driver lacks it);
- `both_ways`: a `single` copy each way at once on two streams (`seconds`: the later end).
"""
from __future__ import annotations

import argparse
import ctypes
import csv
import datetime
import json
import statistics
import subprocess
import time
from pathlib import Path

SINGLE_SIZES = [2 ** k for k in range(12, 29)]           # 4 KiB .. 256 MiB
BLOCK_SIZES = [2 ** k for k in range(13, 25)]            # 8 KiB .. 16 MiB: one block's KV per tensor or per block
BLOCK_BYTES_MOVED = 256 * 2 ** 20                         # each per-block run moves up to this much
REPEATS = 7
FIELDS = ["method", "direction", "copy_bytes", "copies", "seconds", "issue_s", "bytes_per_s"]


class Cuda:
    """The driver's cuMemcpyAsync (what the runtime's cudaMemcpyAsync calls) and cuMemcpyBatchAsync (if present)."""

    H2D, D2H = 1, 2

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        self.batch = getattr(lib, "cuMemcpyBatchAsync", None)
        if self.batch is not None:
            self.batch.restype = ctypes.c_uint
            self.batch.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t] + [ctypes.c_void_p] * 2 + \
                [ctypes.c_size_t] + [ctypes.c_void_p] * 2
        self.memcpy = lib.cuMemcpyAsync
        self.memcpy.restype = ctypes.c_uint
        self.memcpy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]


class _Attrs(ctypes.Structure):
    _fields_ = [("srcAccessOrder", ctypes.c_uint), ("srcLocType", ctypes.c_uint), ("srcLocId", ctypes.c_int),
                ("dstLocType", ctypes.c_uint), ("dstLocId", ctypes.c_int), ("flags", ctypes.c_uint)]


def timed(torch, stream, issue, repeats=REPEATS) -> tuple[float, float]:
    """Median GPU seconds of the issued copies and median host seconds to issue them.

    The stream first spins (`torch.cuda._sleep`) for longer than the host takes to issue, so the events
    time the copy engine alone, not the host's issuing; the first run, a warm-up, sizes the spin.
    """
    gpu, host, spin = [], [], 1_000_000
    for i in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(spin)
        start.record(stream)
        t0 = time.perf_counter()
        issue()
        t1 = time.perf_counter()
        end.record(stream)
        end.synchronize()
        if i:
            gpu.append(start.elapsed_time(end) * 1e-3)
            host.append(t1 - t0)
        else:   # ~2 GHz clocks: four times the issue time, at least ~0.5 ms
            spin = int(max(1e6, 8e9 * (t1 - t0)))
    return statistics.median(gpu), statistics.median(host)


def row(method, direction, size, copies, seconds, issue_s):
    return {"method": method, "direction": direction, "copy_bytes": size, "copies": copies,
            "seconds": f"{seconds:.9g}", "issue_s": f"{issue_s:.9g}",
            "bytes_per_s": f"{size * copies / seconds:.6g}"}


def measure_single(torch, gpu, host, stream):
    for size in SINGLE_SIZES:
        for direction, (dst, src) in (("h2d", (gpu, host)), ("d2h", (host, gpu))):
            def issue(dst=dst, src=src, size=size):
                with torch.cuda.stream(stream):
                    dst[:size].copy_(src[:size], non_blocking=True)
            yield row("single", direction, size, 1, *timed(torch, stream, issue))


def block_pairs(torch, size, total_bytes, copies):
    """Scattered (src, dst) block indices, as a cache's free blocks land: a fixed permutation per size."""
    slots = total_bytes // size
    gen = torch.Generator().manual_seed(size)
    return (torch.randperm(slots, generator=gen)[:copies].tolist(),
            torch.randperm(slots, generator=gen)[:copies].tolist())


def measure_blocks(torch, cuda, gpu, host, stream, total_bytes):
    for size in BLOCK_SIZES:
        copies = max(8, min(2048, BLOCK_BYTES_MOVED // size))
        src_ids, dst_ids = block_pairs(torch, size, total_bytes, copies)
        for direction, kind in (("h2d", cuda.H2D), ("d2h", cuda.D2H)):
            src_base, dst_base = (host, gpu) if kind == cuda.H2D else (gpu, host)
            srcs = [src_base.data_ptr() + i * size for i in src_ids]
            dsts = [dst_base.data_ptr() + i * size for i in dst_ids]
            def issue(srcs=srcs, dsts=dsts, size=size):
                fn, handle = cuda.memcpy, stream.cuda_stream
                for s, d in zip(srcs, dsts):
                    if fn(d, s, size, handle):
                        raise RuntimeError(f"cuMemcpyAsync failed ({size} bytes)")
            yield row("per_block", direction, size, copies, *timed(torch, stream, issue))
            if cuda.batch is not None:
                yield from batch_row(cuda, torch, stream, direction, kind, size, srcs, dsts)


def batch_row(cuda, torch, stream, direction, kind, size, srcs, dsts):
    n = len(srcs)
    src_arr, dst_arr = (ctypes.c_uint64 * n)(*srcs), (ctypes.c_uint64 * n)(*dsts)
    sizes = (ctypes.c_size_t * n)(*([size] * n))
    attrs = _Attrs(srcAccessOrder=3 if kind == cuda.H2D else 1)   # ANY for pinned sources, STREAM for the cache
    index, fail = ctypes.c_size_t(0), ctypes.c_size_t(0)
    status = []

    def issue():
        status.append(cuda.batch(dst_arr, src_arr, sizes, n, ctypes.byref(attrs), ctypes.byref(index), 1,
                                 ctypes.byref(fail), stream.cuda_stream))
    result = timed(torch, stream, issue)
    if any(status):
        print(f"cuMemcpyBatchAsync returned {set(status)} ({direction}, {size} B): left out", flush=True)
        return
    yield row("batch", direction, size, n, *result)


def measure_both_ways(torch, gpu, host, host2, stream):
    other = torch.cuda.Stream()
    half = gpu.numel() // 2
    for size in SINGLE_SIZES[8:]:
        def issue(size=size):
            other.wait_stream(stream)
            with torch.cuda.stream(stream):
                gpu[:size].copy_(host[:size], non_blocking=True)
            with torch.cuda.stream(other):
                host2[:size].copy_(gpu[half:half + size], non_blocking=True)
            stream.wait_stream(other)
        yield row("both_ways", "h2d+d2h", size, 2, *timed(torch, stream, issue))


def environment(torch) -> dict:
    query = "name,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
    try:
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        smi, topo = "", ""
    return {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "nvidia_smi": f"{query}: {smi}", "topology": topo.strip(),
            "pinned": "torch pin_memory=True (cudaHostAlloc)"}


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", required=True, help="catalog name written in the file name (e.g. h200)")
    parser.add_argument("--out", type=Path, required=True)
    return parser


def main(argv=None) -> int:
    import torch
    parser = build_parser()
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    total = 1 << 30
    gpu = torch.empty(total, dtype=torch.uint8, device="cuda")
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    host2 = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    gpu.fill_(1), host.fill_(2), host2.fill_(3)
    stream, cuda = torch.cuda.Stream(), Cuda()
    print(f"driver batch memcpy: {cuda.batch is not None}", flush=True)
    env = environment(torch)
    (args.out / f"{args.gpu}-host-copies.env.json").write_text(json.dumps(env, indent=1) + "\n")
    print(json.dumps(env, indent=1), flush=True)
    path = args.out / f"{args.gpu}-host-copies.csv"
    with path.open("w", newline="") as f:
        out = csv.DictWriter(f, FIELDS)
        out.writeheader()
        for part in (measure_single(torch, gpu, host, stream), measure_blocks(torch, cuda, gpu, host, stream, total),
                     measure_both_ways(torch, gpu, host, host2, stream)):
            for r in part:
                out.writerow(r)
                f.flush()
                print(",".join(str(r[k]) for k in FIELDS), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
