"""Measure a GPU's kernels with the torch backend, for several models' shapes, into one profile CSV.

    python benchmarks/measure_gpu_profile.py --gpu h200 --out measured/      # on a CUDA machine

Writes `<out>/<gpu>-torch.profile.csv` (appended model by model, so a run cut short keeps what it
measured) and `<out>/<gpu>-torch.env.json` (device, driver, software versions, date, SMs, L2). Before
timing anything it checks the Triton paged decode kernel against PyTorch's attention on a gathered
copy of the same cache. A family that fails is reported and skipped; the others still run.

`--prefill-kernel fa3` (Hopper, with the `fa3_fwd` package) times prefill attention with
FlashAttention-3's forward kernel instead of PyTorch's FlashAttention-2, into `<gpu>-fa3.*`, after
checking it against PyTorch's attention:

    python benchmarks/measure_gpu_profile.py --gpu h200 --out measured/ --families prefill_attention \
        --prefill-kernel fa3 --models llama-3.1-8b,llama-2-7b,qwen2.5-7b,qwen3-32b
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import time
import traceback
from pathlib import Path

from kernels_cost_model.errors import ConfigError
from kernels_cost_model.hardware import get_gpu
from kernels_cost_model.models import get_model
from kernels_cost_model.profile_schema import write_profile
from kernels_cost_model.torch_backend import measure_profile, software

ALL = ("matmul", "elementwise", "prefill_attention", "decode_attention")
ATTENTION = ("prefill_attention", "decode_attention")
PLAN = (  # (model, families): GQA 4:1 in full; MHA attention; GQA 7:1 matmuls and decode
    ("llama-3.1-8b", ALL),
    ("llama-2-7b", ATTENTION),
    ("qwen2.5-7b", ("matmul", "decode_attention")),
)


def environment(torch) -> dict:
    props = torch.cuda.get_device_properties(0)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = ""
    return {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0),
            "software": software(torch), "nvidia_smi": smi, "multiprocessors": props.multi_processor_count,
            "l2_bytes": props.L2_cache_size, "memory_bytes": props.total_memory,
            "capability": f"{props.major}.{props.minor}"}


def check_paged_decode(torch) -> float:
    """Largest difference between the Triton paged kernel and SDPA over the gathered cache (bf16)."""
    from kernels_cost_model.paged_decode_triton import PagedDecode
    gen = torch.Generator(device="cuda").manual_seed(0)
    worst = 0.0
    for batch, heads, kv_heads, length in ((3, 32, 8, 1000), (2, 28, 4, 37), (1, 32, 32, 5000)):
        per_req = math.ceil(length / 16)
        k = torch.randn(batch * per_req + 1, 16, kv_heads, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        table = torch.randperm(batch * per_req, device="cuda").view(batch, per_req).to(torch.int32)
        lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, heads, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        got = PagedDecode(torch, q, k, v, table, lens, length, sms)()
        kk = k[table].view(batch, -1, kv_heads, 128)[:, :length].transpose(1, 2)
        vv = v[table].view(batch, -1, kv_heads, 128)[:, :length].transpose(1, 2)
        want = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), kk, vv, enable_gqa=True).squeeze(2)
        worst = max(worst, (got.float() - want.float()).abs().max().item())
    return worst


def check_fa3(torch) -> float:
    """Largest difference between FlashAttention-3 and PyTorch's attention on chunks over a cached
    context (bf16, causal aligned to the chunk's last token, GQA and MHA)."""
    from fa3_fwd_interface import flash_attn_func
    from torch.nn.attention.bias import causal_lower_right
    gen = torch.Generator(device="cuda").manual_seed(0)
    worst = 0.0
    for heads, kv_heads, chunk, ctx in ((32, 8, 100, 900), (28, 4, 16, 3000), (32, 32, 512, 0)):
        q = torch.randn(1, chunk, heads, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, ctx + chunk, kv_heads, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        got = flash_attn_func(q, k, v, causal=True, num_splits=0)
        got = got[0] if isinstance(got, tuple) else got
        want = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=causal_lower_right(chunk, ctx + chunk),
            enable_gqa=kv_heads != heads).transpose(1, 2)
        worst = max(worst, (got.float() - want.float()).abs().max().item())
    return worst


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", required=True, help="catalog name written in the device column (e.g. h200)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="the torch backend's small grid")
    parser.add_argument("--models", default="", help="comma-separated models, each in --families "
                        "(default: the built-in plan)")
    parser.add_argument("--families", default=",".join(ALL), help="comma-separated families to measure")
    parser.add_argument("--prefill-kernel", choices=("sdpa", "fa3"), default="sdpa",
                        help="prefill attention kernel: PyTorch's FlashAttention-2 or (Hopper) FlashAttention-3")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    wanted = tuple(args.families.split(","))
    plan = [(m, wanted) for m in args.models.split(",")] if args.models else PLAN
    unknown = sorted(set(wanted) - set(ALL))
    if unknown:
        parser.error(f"--families: unknown {unknown}; expected some of {list(ALL)}")
    try:
        get_gpu(args.gpu)
        for model, _families in plan:
            get_model(model)
    except ConfigError as exc:
        parser.error(str(exc))
    import torch
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment(torch)
    tag = "torch" if args.prefill_kernel == "sdpa" else args.prefill_kernel
    (args.out / f"{args.gpu}-{tag}.env.json").write_text(json.dumps(env, indent=1) + "\n")
    print(json.dumps(env), flush=True)
    checks = [("paged decode", check_paged_decode)] if "decode_attention" in wanted else []
    checks += [("FlashAttention-3 prefill", check_fa3)] if args.prefill_kernel == "fa3" else []
    for name, check in checks:
        err = check(torch)
        print(f"{name} vs SDPA: max abs difference {err:.4f}", flush=True)
        if err > 0.05:
            print(f"{name} kernel disagrees with SDPA; not timing it", file=sys.stderr)
            return 1
    rows: list[dict] = []
    for model, families in plan:
        for family in (f for f in families if f in wanted):
            start = time.perf_counter()
            try:
                got = measure_profile(model, "cuda", quick=args.quick, gpu=args.gpu, families=(family,),
                                      prefill_kernel=args.prefill_kernel)
            except Exception:  # report and go on: one broken family must not cost the others
                traceback.print_exc()
                continue
            rows += got
            write_profile(rows, args.out / f"{args.gpu}-{tag}.profile.csv")
            print(f"{model} {family}: {len(got)} kernels in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
