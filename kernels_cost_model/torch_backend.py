"""Measure real kernels with PyTorch on the local device and write them as a profile.

Needs the optional extra: `pip install servesim[torch]`. Measures, for one model's shapes:
the four weight matmuls over a grid of token counts, RMSNorm / SiLU-and-multiply / residual add,
causal prefill attention (scaled_dot_product_attention, chunk of new tokens over cached context),
and decode attention over a paged KV cache (gather the blocks of each request, then attend).
Each point: warm-up calls, then timed calls with device synchronisation; the median on CUDA, the
fastest on CPU (the least-disturbed run: a small shared CPU's other work only ever adds time).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from kernels_cost_model.errors import ConfigError

from .models import get_model
from .profile_schema import validate_row


@dataclass(frozen=True)
class Grid:
    """Shapes to measure and how many times."""

    tokens: tuple[int, ...]
    chunks: tuple[int, ...]
    contexts: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    warmup: int
    repeats: int


GRIDS = {  # (device kind, quick)
    ("cpu", True): Grid((1, 8, 32, 96, 256), (16, 64, 192), (0, 256, 768), (1, 4, 16), (128, 512, 1536), 1, 3),
    ("cpu", False): Grid((1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512),
                         (16, 32, 64, 96, 128, 192, 256), (0, 64, 128, 256, 512, 1024),
                         (1, 2, 4, 8, 16, 32), (64, 128, 256, 512, 1024, 2048), 2, 5),
    ("cuda", True): Grid((1, 16, 64, 256, 1024, 4096), (64, 256, 1024), (0, 1024, 4096), (1, 16, 64, 256),
                         (256, 1024, 4096), 3, 10),
    ("cuda", False): Grid(tuple(sorted({1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
                                        2048, 3072, 4096, 6144, 8192})), (32, 64, 128, 256, 512, 1024, 2048),
                          (0, 256, 1024, 2048, 4096, 8192), (1, 4, 8, 16, 32, 64, 128, 256),
                          (128, 512, 1024, 2048, 4096, 8192), 5, 20),
}

DEFAULT_MODEL = {"cpu": "qwen2.5-0.5b", "cuda": "llama-3.1-8b"}


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ConfigError("backend", "torch", "PyTorch is not installed: pip install 'servesim[torch]'") from exc
    return torch


def _timer(torch, device: str, warmup: int, repeats: int):
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def measure(fn) -> float:
        for _ in range(warmup):
            fn()
        sync()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            sync()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) if device.startswith("cuda") else min(samples)
    return measure


def measure_profile(model: str = "", device: str = "cpu", quick: bool = False,
                    cpu_threads: int | None = 1) -> list[dict]:
    """Run the grid for `model` on `device` ("cpu" or "cuda[:i]"); returns validated profile rows.

    On CPU, `cpu_threads` (default 1) pins PyTorch's intra-op threads for the duration: a single
    thread is far less disturbed by other work on a small shared machine; None keeps PyTorch's choice.
    """
    torch = _torch()
    previous = torch.get_num_threads()
    if cpu_threads and not device.startswith("cuda"):
        torch.set_num_threads(cpu_threads)
    try:
        return _measure(torch, model, device, quick)
    finally:
        torch.set_num_threads(previous)


def _measure(torch, model: str, device: str, quick: bool) -> list[dict]:
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "CUDA is not available on this machine")
    if device != "cpu" and kind == "cpu":
        raise ConfigError("device", device, "expected 'cpu' or 'cuda[:index]'")
    spec = get_model(model or DEFAULT_MODEL[kind])
    grid = GRIDS[(kind, quick)]
    dtype = torch.float32 if kind == "cpu" else torch.bfloat16
    dtype_name = "float32" if kind == "cpu" else "bfloat16"
    name = "cpu" if kind == "cpu" else torch.cuda.get_device_name(device)
    source = f"servesim torch backend (torch {torch.__version__}, {name}, {spec.name})"
    gen = torch.Generator(device=device).manual_seed(0)
    measure = _timer(torch, device, grid.warmup, grid.repeats)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    def row(**fields) -> dict:
        return validate_row({"dtype": dtype_name, "device": device if kind == "cpu" else name,
                             "source": source, **fields}, "<torch backend>")

    rows: list[dict] = []
    with torch.inference_mode():
        rows += _matmuls(spec, grid, rand, measure, row)
        rows += _elementwise(torch, spec, grid, rand, measure, row)
        rows += _prefill(torch, spec, grid, rand, measure, row)
        rows += _decode(torch, spec, grid, rand, measure, row, device)
    return rows


def _matmuls(spec, grid, rand, measure, row) -> list[dict]:
    h, q, kv = spec.hidden_size, spec.q_dim, spec.kv_dim
    inter = spec.moe_intermediate_size if spec.is_moe else spec.intermediate_size
    shapes = {"qkv_proj": (h, q + 2 * kv), "o_proj": (q, h), "mlp_up": (h, 2 * inter), "mlp_down": (inter, h)}
    out = []
    for op, (k, n) in shapes.items():
        w = rand(k, n)
        for t in grid.tokens:
            x = rand(t, k)
            out.append(row(operator=op, m=t, n=n, k=k, measured_s=measure(lambda: x @ w)))
    return out


def _elementwise(torch, spec, grid, rand, measure, row) -> list[dict]:
    h = spec.hidden_size
    inter = spec.moe_intermediate_size if spec.is_moe else spec.intermediate_size
    norm_w = rand(h)
    out = []
    for t in grid.tokens:
        x, y, gu = rand(t, h), rand(t, h), rand(t, 2 * inter)

        def rms_norm():
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w

        def silu_mul():
            gate, up = gu.chunk(2, dim=-1)
            return torch.nn.functional.silu(gate) * up
        out.append(row(operator="rms_norm", m=t, n=h, measured_s=measure(rms_norm)))
        out.append(row(operator="silu_mul", m=t, n=inter, measured_s=measure(silu_mul)))
        out.append(row(operator="add", m=t, n=h, measured_s=measure(lambda: x + y)))
    return out


def _prefill(torch, spec, grid, rand, measure, row) -> list[dict]:
    sdpa = torch.nn.functional.scaled_dot_product_attention
    nh, kvh, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    out = []
    for chunk in grid.chunks:
        for ctx in grid.contexts:
            q, k, v = rand(1, nh, chunk, hd), rand(1, kvh, ctx + chunk, hd), rand(1, kvh, ctx + chunk, hd)
            if ctx == 0:
                def fn():
                    return sdpa(q, k, v, is_causal=True, enable_gqa=True)
            else:  # query i of the chunk sees every cached key and chunk keys 0..i
                mask = torch.ones(chunk, ctx + chunk, dtype=torch.bool, device=q.device).tril(diagonal=ctx)

                def fn():
                    return sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
            out.append(row(operator="prefill_attention", batch=1, chunk=chunk, context=ctx, num_heads=nh,
                           num_kv_heads=kvh, head_dim=hd, measured_s=measure(fn)))
    return out


def _decode(torch, spec, grid, rand, measure, row, device, block_size: int = 16) -> list[dict]:
    sdpa = torch.nn.functional.scaled_dot_product_attention
    nh, kvh, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    gen = torch.Generator(device="cpu").manual_seed(1)
    out = []
    for batch in grid.decode_batches:
        for ctx in grid.decode_contexts:
            per_req = -(-(ctx + 1) // block_size)
            pool_k = rand(batch * per_req + 1, block_size, kvh, hd)
            pool_v = rand(batch * per_req + 1, block_size, kvh, hd)
            table = torch.randperm(batch * per_req, generator=gen).view(batch, per_req).to(device)
            q = rand(batch, nh, 1, hd)

            def fn():
                k = pool_k[table].view(batch, -1, kvh, hd)[:, : ctx + 1].transpose(1, 2)
                v = pool_v[table].view(batch, -1, kvh, hd)[:, : ctx + 1].transpose(1, 2)
                return sdpa(q, k, v, enable_gqa=True)
            out.append(row(operator="decode_attention", batch=batch, context=ctx, num_heads=nh,
                           num_kv_heads=kvh, head_dim=hd, measured_s=measure(fn)))
    return out
