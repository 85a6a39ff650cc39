"""Measure real kernels with PyTorch on the local device and write them as a profile.

Needs the optional extra: `pip install servesim[torch]`. Measures, for one model's shapes:
the four weight matmuls over a grid of token counts; RMSNorm (with and without the residual add),
SiLU-and-multiply, residual add, rotary embedding and embedding lookup; causal prefill attention (a
chunk of new tokens over cached context); decode attention over a paged KV cache.

On CUDA the kernels are the ones vLLM runs, as far as PyTorch holds them: cuBLAS matmuls; norms and
activations compiled by Inductor with a symbolic token count, first at the grid's largest (vLLM's
default `torch.compile` path); FlashAttention through `scaled_dot_product_attention` with the causal
mask aligned to the chunk's end; decode through servesim's Triton paged kernel, which reads each
request's blocks in place (`paged_decode_triton`). Timing (`torch_timing`): the median of CUDA-graph
replays of several calls between CUDA events (no launch gaps, as in vLLM's captured steps), over enough
copies of the weights or KV cache that each call reads them from DRAM, not from the L2 the previous
call filled. On CPU: eager kernels, decode gathers the blocks first, the fastest of the timed calls
(the least-disturbed run: a small shared CPU's other work only ever adds time).
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass

from kernels_cost_model.errors import ConfigError, require

from .models import get_model
from .profile_schema import validate_row
from .torch_timing import cpu_timer, cuda_timer


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


PREFILL_KERNELS = ("sdpa", "fa3")
"""Prefill attention kernels the backend can time (`measure_profile`'s `prefill_kernel`)."""

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
                          (128, 512, 1024, 2048, 4096, 8192), 3, 10),
}

BLOCK_SIZE = 16
"""vLLM's default KV-cache block size (tokens)."""
ROPE_POSITIONS = 8192
"""Rows of the rotary cos/sin cache the positions index."""
EMBEDDING_ROWS = 32768
"""Rows of the embedding table measured: a lookup reads only the rows of its tokens, so a smaller table
than the vocabulary costs the same and keeps the CPU grid light."""

DEFAULT_MODEL = {"cpu": "qwen2.5-0.5b", "cuda": "llama-3.1-8b"}


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ConfigError("backend", "torch", "PyTorch is not installed: pip install 'servesim[torch]'") from exc
    return torch


@dataclass
class _Session:
    """What the measuring functions share: the device, the random source, the timer, the row maker."""

    torch: object
    device: str
    cuda: bool
    rand: object
    measure: object
    row: object
    prefill_kernel: str = "sdpa"


def measure_profile(model: str = "", device: str = "cpu", quick: bool = False,
                    cpu_threads: int | None = 1, gpu: str = "",
                    families: tuple[str, ...] = ("matmul", "elementwise", "prefill_attention",
                                                 "decode_attention"), prefill_kernel: str = "sdpa") -> list[dict]:
    """Run the grid for `model` on `device` ("cpu" or "cuda[:i]"); returns validated profile rows.

    `gpu` names the catalog GPU written in the rows' device column (default: the name CUDA reports).
    On CPU, `cpu_threads` (default 1) pins PyTorch's intra-op threads for the duration: a single
    thread is far less disturbed by other work on a small shared machine; None keeps PyTorch's choice.
    `prefill_kernel`: "sdpa" (PyTorch's FlashAttention-2) or, on Hopper, "fa3" (FlashAttention-3's
    forward kernel from the `fa3_fwd` package, the kernel family vLLM's FLASH_ATTN backend runs there).
    """
    require(prefill_kernel in PREFILL_KERNELS, "prefill_kernel", prefill_kernel, f"must be one of {PREFILL_KERNELS}")
    torch = _torch()
    previous = torch.get_num_threads()
    if cpu_threads and not device.startswith("cuda"):
        torch.set_num_threads(cpu_threads)
    try:
        return _measure(torch, model, device, quick, gpu, families, prefill_kernel)
    finally:
        torch.set_num_threads(previous)


def software(torch) -> str:
    """The versions a measurement ran under, for its source column."""
    parts = [f"torch {torch.__version__}"]
    if torch.cuda.is_available():
        parts.append(f"CUDA {torch.version.cuda}")
        try:
            import triton
            parts.append(f"triton {triton.__version__}")
        except ImportError:
            pass
    return ", ".join(parts)


def _measure(torch, model: str, device: str, quick: bool, gpu: str, families: tuple[str, ...],
             prefill_kernel: str = "sdpa") -> list[dict]:
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise ConfigError("device", device, "CUDA is not available on this machine")
    if device != "cpu" and not cuda:
        raise ConfigError("device", device, "expected 'cpu' or 'cuda[:index]'")
    unknown = sorted(set(families) - set(MEASURERS))
    if unknown:
        raise ConfigError("families", unknown, f"expected some of {sorted(MEASURERS)}")
    kind = "cuda" if cuda else "cpu"
    spec = get_model(model or DEFAULT_MODEL[kind])
    grid = GRIDS[(kind, quick)]
    dtype = torch.bfloat16 if cuda else torch.float32
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(torch.device(device).index or 0)
    source = (f"servesim torch backend {datetime.date.today().isoformat()} ({software(torch)}, {name}, "
              f"{spec.name})")
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    def row(kernel: str = "", **fields) -> dict:
        return validate_row({"dtype": "bfloat16" if cuda else "float32", "device": gpu or name,
                             "source": f"{source}; {kernel}" if kernel else source, **fields},
                            "<torch backend>")

    timer = cuda_timer(torch, device, grid.warmup, grid.repeats) if cuda else cpu_timer(grid.warmup, grid.repeats)
    session = _Session(torch, device, cuda, rand, timer, row, prefill_kernel)
    rows: list[dict] = []
    with torch.inference_mode():
        for family in families:
            rows += MEASURERS[family](session, spec, grid)
    return rows


def _matmuls(s: _Session, spec, grid) -> list[dict]:
    """vLLM's unquantised linear layers: `F.linear` of the activations by an [n x k] weight."""
    h, q, kv = spec.hidden_size, spec.q_dim, spec.kv_dim
    inter = spec.moe_intermediate_size if spec.is_moe else spec.intermediate_size
    shapes = {"qkv_proj": (h, q + 2 * kv), "o_proj": (q, h), "mlp_up": (h, 2 * inter), "mlp_down": (inter, h)}
    linear = s.torch.nn.functional.linear
    out = []
    for op, (k, n) in shapes.items():
        for t in grid.tokens:
            def make(t=t, k=k, n=n):
                x, w = s.rand(t, k), s.rand(n, k)
                return lambda: linear(x, w)
            out.append(s.row(operator=op, m=t, n=n, k=k, measured_s=s.measure(make, 2.0 * (t * k + k * n))))
    return out


def _elementwise_ops(torch, compiled: bool) -> dict:
    """vLLM's native forms: RMSNorm (computed in fp32), its fused residual add, SiLU-and-multiply,
    residual add, NeoX rotary embedding of q and k by position, and the embedding lookup."""
    def rms_norm(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def add_rms_norm(x, residual, w):
        summed = x + residual
        return rms_norm(summed, w), summed

    def silu_mul(gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    def add(x, y):
        return x + y

    def rope(q, k, positions, cos_sin):
        cos, sin = cos_sin[positions].chunk(2, dim=-1)
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def rotate(x, cos, sin):
        x = x.view(x.shape[0], -1, 2 * cos.shape[-1])
        x1, x2 = x.chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(1)

    def embedding(ids, table):
        return torch.nn.functional.embedding(ids, table)
    ops = {"rms_norm": rms_norm, "add_rms_norm": add_rms_norm, "silu_mul": silu_mul, "add": add,
           "rope": rope, "embedding": embedding}
    if compiled:  # a fresh cache, so that another model's widths do not turn symbolic too (_tune_at)
        torch._dynamo.reset()
        ops = {name: torch.compile(fn) for name, fn in ops.items()}
    return ops


def _elementwise_cases(s: _Session, spec, t: int, vocab: int, cos_sin, table) -> tuple:
    """(operator, width, make operands) at `t` tokens; operands as (token-dimension ones, fixed ones)."""
    h, inter = spec.hidden_size, spec.moe_intermediate_size if spec.is_moe else spec.intermediate_size
    positions = s.torch.randint(0, ROPE_POSITIONS, (t,), device=s.device)
    ids = s.torch.randint(0, vocab, (t,), device=s.device)
    return (("rms_norm", h, lambda: ((s.rand(t, h),), (s.rand(h),))),
            ("add_rms_norm", h, lambda: ((s.rand(t, h), s.rand(t, h)), (s.rand(h),))),
            ("silu_mul", inter, lambda: ((s.rand(t, 2 * inter),), ())),
            ("add", h, lambda: ((s.rand(t, h), s.rand(t, h)), ())),
            ("rope", spec.q_dim + spec.kv_dim,
             lambda: ((s.rand(t, spec.q_dim), s.rand(t, spec.kv_dim), positions), (cos_sin,))),
            ("embedding", h, lambda: ((ids,), (table,))))


def _tune_at(torch, ops: dict, cases: tuple) -> None:
    """Compile each op once with its token dimension marked dynamic, at `cases`' token count: Inductor
    picks its kernels' configurations on that first call, as vLLM's compile run does at
    max_num_batched_tokens. (Tuned on a first call of a few tokens instead, the pick is noise: the same
    kernel then ran up to 2x slower or faster at 8,192 tokens from one run to the next.)"""
    for op, _width, operands in cases:
        tokens, fixed = operands()
        for tensor in tokens:
            torch._dynamo.mark_dynamic(tensor, 0)
        ops[op](*tokens, *fixed)


def _elementwise(s: _Session, spec, grid) -> list[dict]:
    ops = _elementwise_ops(s.torch, compiled=s.cuda)
    kernel = "Inductor (torch.compile, token count symbolic, tuned at the grid's largest)" if s.cuda else "eager"
    cos_sin = s.rand(ROPE_POSITIONS, spec.head_dim).float()
    vocab = min(spec.vocab_size, EMBEDDING_ROWS)
    table = s.rand(vocab, spec.hidden_size)
    if s.cuda:
        _tune_at(s.torch, ops, _elementwise_cases(s, spec, max(grid.tokens), vocab, cos_sin, table))
    out = []
    for t in grid.tokens:
        for op, width, operands in _elementwise_cases(s, spec, t, vocab, cos_sin, table):
            def make(fn=ops[op], operands=operands):
                tokens, fixed = operands()
                return lambda: fn(*tokens, *fixed)
            out.append(s.row(kernel, operator=op, m=t, n=width, measured_s=s.measure(make)))
    return out


def _prefill(s: _Session, spec, grid) -> list[dict]:
    nh, kvh, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    attend, kernel = _prefill_kernel(s, nh, kvh, hd)
    out = []
    for chunk in grid.chunks:
        for ctx in grid.contexts:
            def make(chunk=chunk, ctx=ctx):
                return attend(chunk, ctx)
            cold = 2.0 * (ctx + chunk) * kvh * hd * 2
            out.append(s.row(kernel, operator="prefill_attention", batch=1, chunk=chunk, context=ctx,
                             num_heads=nh, num_kv_heads=kvh, head_dim=hd, measured_s=s.measure(make, cold)))
    return out


def _prefill_kernel(s: _Session, nh: int, kvh: int, hd: int):
    """(make a chunk's attention over its context, kernel name). CUDA: FlashAttention, the causal mask
    aligned to the chunk's last token (as vLLM's varlen call); KV heads repeated where it takes no GQA.
    CPU: the mask materialised."""
    torch = s.torch
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if s.prefill_kernel == "fa3":
        return _fa3_prefill(s, nh, kvh, hd)
    if not s.cuda:
        def attend(chunk, ctx):
            q, k, v = s.rand(1, nh, chunk, hd), s.rand(1, kvh, ctx + chunk, hd), s.rand(1, kvh, ctx + chunk, hd)
            mask = torch.ones(chunk, ctx + chunk, dtype=torch.bool, device=q.device).tril(diagonal=ctx)
            return lambda: sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
        return attend, "eager SDPA, materialised mask"
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    def flash(heads_kv: int):
        def attend(chunk, ctx):
            q = s.rand(1, nh, chunk, hd)
            k, v = s.rand(1, heads_kv, ctx + chunk, hd), s.rand(1, heads_kv, ctx + chunk, hd)
            mask = causal_lower_right(chunk, ctx + chunk)

            def fn():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return sdpa(q, k, v, attn_mask=mask, enable_gqa=heads_kv != nh)
            return fn
        return attend
    try:
        flash(kvh)(16, 16)()
        return flash(kvh), "FlashAttention (PyTorch SDPA), causal lower-right"
    except (RuntimeError, ValueError, NotImplementedError):
        return flash(nh), "FlashAttention (PyTorch SDPA), causal lower-right, KV heads repeated"


def _fa3_prefill(s: _Session, nh: int, kvh: int, hd: int):
    """(make a chunk's attention over its context, kernel name) with FlashAttention-3's forward kernel:
    GQA native, causal aligned to the chunk's last token (seqlen_q < seqlen_k), KV splits by FA3's own
    heuristic (num_splits=0, as vLLM's call leaves them), the KV contiguous (vLLM's call reads it through
    a block table)."""
    require(s.cuda and s.torch.cuda.get_device_capability(s.device)[0] == 9, "prefill_kernel", "fa3",
            "FlashAttention-3 runs on Hopper GPUs (compute capability 9.x)")
    try:
        from fa3_fwd_interface import flash_attn_func
    except ImportError as exc:
        raise ConfigError("prefill_kernel", "fa3", "needs the fa3_fwd package (FlashAttention-3's forward "
                          "kernel): pip install fa3-fwd") from exc

    def attend(chunk, ctx):
        q = s.rand(1, chunk, nh, hd)
        k, v = s.rand(1, ctx + chunk, kvh, hd), s.rand(1, ctx + chunk, kvh, hd)
        return lambda: flash_attn_func(q, k, v, causal=True, num_splits=0)
    return attend, "FlashAttention-3 (fa3_fwd), causal lower-right, splits by its heuristic"


def _decode(s: _Session, spec, grid) -> list[dict]:
    nh, kvh, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    gen = s.torch.Generator(device="cpu").manual_seed(1)
    attend, kernel = _decode_kernel(s, nh, kvh, hd, gen)
    out = []
    for batch in grid.decode_batches:
        for ctx in grid.decode_contexts:
            def make(batch=batch, ctx=ctx):
                return attend(batch, ctx + 1)
            cold = 2.0 * batch * (ctx + 1) * kvh * hd * 2
            out.append(s.row(kernel, operator="decode_attention", batch=batch, context=ctx, num_heads=nh,
                             num_kv_heads=kvh, head_dim=hd, measured_s=s.measure(make, cold)))
    return out


def _decode_kernel(s: _Session, nh: int, kvh: int, hd: int, gen):
    """(make one step's attention for `batch` requests of `length` tokens, kernel name), the cache in
    vLLM's layout and its blocks in random order. CUDA: read in place; CPU: gathered, then attended."""
    torch = s.torch

    def cache(batch, length):
        per_req = -(-length // BLOCK_SIZE)
        pool_k = s.rand(batch * per_req + 1, BLOCK_SIZE, kvh, hd)
        pool_v = s.rand(batch * per_req + 1, BLOCK_SIZE, kvh, hd)
        table = torch.randperm(batch * per_req, generator=gen).view(batch, per_req)
        return pool_k, pool_v, table.to(device=s.device, dtype=torch.int32)
    if s.cuda:
        from .paged_decode_triton import PagedDecode
        sms = torch.cuda.get_device_properties(s.device).multi_processor_count

        def paged(batch, length):
            pool_k, pool_v, table = cache(batch, length)
            lens = torch.full((batch,), length, dtype=torch.int32, device=s.device)
            return PagedDecode(torch, s.rand(batch, nh, hd), pool_k, pool_v, table, lens, length, sms)
        return paged, "servesim Triton paged decode (blocks read in place, split-KV)"
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def gathered(batch, length):
        pool_k, pool_v, table = cache(batch, length)
        q = s.rand(batch, nh, 1, hd)

        def fn():
            k = pool_k[table].view(batch, -1, kvh, hd)[:, :length].transpose(1, 2)
            v = pool_v[table].view(batch, -1, kvh, hd)[:, :length].transpose(1, 2)
            return sdpa(q, k, v, enable_gqa=True)
        return fn
    return gathered, "eager gather, then SDPA"


MEASURERS = {"matmul": _matmuls, "elementwise": _elementwise, "prefill_attention": _prefill,
             "decode_attention": _decode}
