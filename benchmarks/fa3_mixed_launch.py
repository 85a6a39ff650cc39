"""Decodes beside a prefill chunk on Hopper: FlashAttention-3's mixed launches against the serving price.

    python benchmarks/fa3_mixed_launch.py                                   # the check (no GPU)
    python benchmarks/fa3_mixed_launch.py --measure --gpu h200 --out DIR    # on a Hopper GPU with fa3_fwd

vLLM's FLASH_ATTN backend runs a chunked-prefill step's attention as one varlen launch: the chunk's
query rows and every decode's one row, each over its own keys. `--measure` times such launches with
FlashAttention-3's forward kernel (`fa3_fwd`; KV contiguous per sequence where vLLM reads it through a
block table, splits by FA3's heuristic), and each one's parts alone (the chunk; the decodes), through
the torch backend's CUDA-graph timer, into `<gpu>-fa3-mixed.csv` (one row per launch: heads, chunk and
its cached keys, decodes and their keys, seconds; `launch` = mixed, chunk or decodes).

The check prices every measured launch with the shipped calibration of its GPU (attention of one layer,
`RooflineCostModel.breakdown`, CUDA graphs and CPU time off) and prints, per head layout, the median
error of the mixed launches, of their parts, and how much the measured mixed launch saves over its parts
run one after the other (what the price adds up).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import sys
import warnings
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_cost_model.batch import BatchShape  # noqa: E402
from kernels_cost_model.builder import make_cost_model  # noqa: E402
from kernels_cost_model.gpu_calibration import MEASURED_DIR  # noqa: E402

#: (model whose head layout is measured, query heads, KV heads): GQA 4:1, MHA, GQA 8:1
LAYOUTS = (("llama-3.1-8b", 32, 8), ("llama-2-7b", 32, 32), ("qwen3-32b", 64, 8))
CHUNKS = ((512, 0), (512, 4096), (2048, 0), (2048, 4096))     # (chunk tokens, its cached keys)
DECODES = ((16, 1024), (64, 1024), (64, 4096), (128, 2048), (256, 1024))   # (decodes, keys each)
HEAD_DIM = 128
COLUMNS = ("model", "num_heads", "num_kv_heads", "head_dim", "launch", "chunk", "kv_prefill", "n_decode",
           "kv_decode", "measured_s", "device", "source")
GPUS = ("h100-sxm", "h200")


def launches() -> list[tuple]:
    """(model, heads, KV heads, launch, chunk, kv_prefill, n_decode, kv_decode) of the grid: each
    mixed launch, each chunk alone and each set of decodes alone."""
    out = set()
    for (model, nh, kvh), (chunk, kvp), (n, kvd) in itertools.product(LAYOUTS, CHUNKS, DECODES):
        out |= {(model, nh, kvh, "mixed", chunk, kvp, n, kvd), (model, nh, kvh, "chunk", chunk, kvp, 0, 0),
                (model, nh, kvh, "decodes", 0, 0, n, kvd)}
    return sorted(out)


def measure(gpu: str, out_dir: Path) -> Path:
    """Time the grid on this machine's GPU (Hopper, fa3_fwd installed) into `<out_dir>/<gpu>-fa3-mixed.csv`."""
    import torch
    from fa3_fwd_interface import flash_attn_varlen_func
    from kernels_cost_model.torch_backend import software
    from kernels_cost_model.torch_timing import cuda_timer
    timer = cuda_timer(torch, "cuda", 3, 10)
    gen = torch.Generator(device="cuda").manual_seed(0)
    device = torch.cuda.get_device_name(0)
    source = f"servesim {datetime.date.today().isoformat()} ({software(torch)}, {device}, fa3_fwd)"

    def make(nh, kvh, lengths_q, lengths_k):
        q = torch.randn(sum(lengths_q), nh, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(sum(lengths_k), kvh, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        cu_q = torch.tensor([0, *itertools.accumulate(lengths_q)], dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0, *itertools.accumulate(lengths_k)], dtype=torch.int32, device="cuda")
        return lambda: flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True,
                                              num_splits=0)

    path = out_dir / f"{gpu}-fa3-mixed.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for model, nh, kvh, launch, chunk, kvp, n, kvd in launches():
            lengths_q = ([chunk] if chunk else []) + [1] * n
            lengths_k = ([kvp + chunk] if chunk else []) + [kvd] * n
            cold = 2.0 * sum(lengths_k) * kvh * HEAD_DIM * 2
            seconds = timer(lambda: make(nh, kvh, lengths_q, lengths_k), cold)
            writer.writerow((model, nh, kvh, HEAD_DIM, launch, chunk, kvp, n, kvd, seconds, gpu, source))
            f.flush()
    return path


def read(path: Path) -> list[dict]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for key in ("num_heads", "num_kv_heads", "head_dim", "chunk", "kv_prefill", "n_decode", "kv_decode"):
            r[key] = int(r[key])
        r["measured_s"] = float(r["measured_s"])
    return rows


def priced(rows: list[dict], gpu: str) -> list[float]:
    """The shipped calibration's attention time of one layer for each launch."""
    models, out = {}, []
    for r in rows:
        if r["model"] not in models:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                models[r["model"]] = make_cost_model(r["model"], gpu, 1, enforce_eager=True, cpu_overhead=False)
        cm = models[r["model"]]
        chunk, n = r["chunk"], r["n_decode"]
        new = ([chunk] if chunk else []) + [1] * n
        context = ([r["kv_prefill"]] if chunk else []) + [r["kv_decode"] - 1] * n
        b = cm.breakdown(BatchShape(new, context, len(new)))
        out.append((b["prefill_attention"] + b["decode_attention"]) / cm.layers)
    return out


def check(gpu: str, path: Path) -> dict:
    """{head layout: (mixed rows, median error of mixed, of parts, measured saving, priced saving)}."""
    rows = read(path)
    prices = dict(zip(map(id, rows), priced(rows, gpu)))
    alone = {(r["model"], r["launch"], r["chunk"], r["kv_prefill"], r["n_decode"], r["kv_decode"]): r for r in rows}
    out = {}
    for model, nh, kvh in LAYOUTS:
        mixed = [r for r in rows if r["model"] == model and r["launch"] == "mixed"]
        parts = [r for r in rows if r["model"] == model and r["launch"] != "mixed"]
        saved, priced_saved = [], []
        for r in mixed:
            c = alone[(model, "chunk", r["chunk"], r["kv_prefill"], 0, 0)]
            d = alone[(model, "decodes", 0, 0, r["n_decode"], r["kv_decode"])]
            saved.append(1.0 - r["measured_s"] / (c["measured_s"] + d["measured_s"]))
            priced_saved.append(1.0 - prices[id(r)] / (prices[id(c)] + prices[id(d)]))
        out[f"{nh}/{kvh}"] = (len(mixed), median(prices[id(r)] / r["measured_s"] - 1 for r in mixed),
                              median(prices[id(r)] / r["measured_s"] - 1 for r in parts), median(saved),
                              median(priced_saved))
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="time the grid on this machine's Hopper GPU")
    parser.add_argument("--gpu", default="h200", choices=GPUS)
    parser.add_argument("--out", type=Path, default=MEASURED_DIR)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.measure:
        print(f"wrote {measure(args.gpu, args.out)}")
        return 0
    print(f"{'gpu':9s} {'heads':6s} {'mixed':>5s} {'mixed err':>9s} {'parts err':>9s} {'saved':>6s} {'priced':>6s}")
    for gpu in GPUS:
        path = MEASURED_DIR / f"{gpu}-fa3-mixed.csv"
        if not path.is_file():
            continue
        for heads, (n, mixed, parts, saved, priced_saved) in check(gpu, path).items():
            print(f"{gpu:9s} {heads:6s} {n:5d} {100 * mixed:+8.1f}% {100 * parts:+8.1f}% {100 * saved:5.1f}% "
                  f"{100 * priced_saved:5.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
