"""Whole decode steps on one GPU, composed of the kernels vLLM runs, against the price of their sum.

    python benchmarks/decode_step_composed.py                                     # the check (no GPU)
    python benchmarks/decode_step_composed.py --measure --gpu h100-sxm --out DIR  # on a Hopper GPU with fa3_fwd

servesim prices a step as the sum of its operators, each from a calibration fitted to kernels timed one
at a time. Whether that sum is what a GPU takes for the whole step (gaps between kernels, caches warm
from the previous kernel, one rank's share of a tensor-parallel model hitting a floor) is what this
measures. `--measure` builds one rank of a dense Llama model with random weights (every layer its own,
scaled so activations stay normal): embedding, per layer the fused residual-add RMSNorm, QKV projection,
rotary embedding, the KV-cache write, FlashAttention-3 decode (vLLM's full-CUDA-graph call: scheduler
metadata ahead, at most 32 splits; KV contiguous per request, since the `fa3_fwd` build reads no paged
KV), O projection, RMSNorm, gate-up projection, SiLU-and-multiply and down projection; then the final norm
and the LM head's vocabulary shard with an argmax. Norms, rotary embedding and the activation are
compiled by Inductor (token count symbolic), matmuls are cuBLAS through PyTorch. Each step is captured in
one CUDA graph, as vLLM replays decode-only batches, and timed as the median of 20 replays. A rank of a
tensor-parallel model runs its shard of heads, MLP and vocabulary; its all-reduces are left out (one
GPU), so the check compares with servesim's step less its collectives. Writes `<gpu>-decode-steps.csv`.
"""
from __future__ import annotations

import argparse
import csv
from contextlib import contextmanager
import datetime
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fa3_paged_decode import measure_or_check, measure_or_check_parser  # noqa: E402

#: (model, tensor-parallel size of the rank built): Llama-3.1-8B whole, one rank of 70B at TP 4 and 8
RANKS = (("llama-3.1-8b", 1), ("llama-3.1-70b", 8), ("llama-3.1-70b", 4))
BATCHES = (1, 8, 32, 128, 256)
CONTEXTS = (128, 1024)
REPLAYS = 20
GRAPH_MAX_SPLITS = 32   # vLLM 0.19.1 flash_attn_max_num_splits_for_cuda_graph (vllm/config/attention.py)
ROPE_POSITIONS = 8192
COLUMNS = ("model", "tp", "layers", "batch", "context", "measured_s", "p10_s", "p90_s", "device", "source")
COLLECTIVE_TERMS = ("all_reduce", "all_gather", "collective")
GPUS = ("h100-sxm", "h200")
DEVICE = "cuda"


def rank_shapes(spec, tp: int) -> dict:
    """One rank's widths under vLLM's tensor parallelism (KV heads replicated when fewer than ranks)."""
    return {"hidden": spec.hidden_size, "heads": spec.num_heads // tp, "kv_heads": max(1, spec.num_kv_heads // tp),
            "head_dim": spec.head_dim, "inter": spec.intermediate_size // tp,
            "vocab": math.ceil(spec.vocab_size / tp), "layers": spec.num_layers}


class Rank:
    """Weights, KV cache and one decode step of a rank (`step(batch, context)` returns a callable)."""

    def __init__(self, torch, fa3, ops, shapes: dict, max_tokens: int, dtype=None):
        self.torch, self.fa3, self.ops, self.s = torch, fa3, ops, shapes
        self.dtype = dtype or torch.bfloat16
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        s, hd = shapes, shapes["head_dim"]

        def weight(n, k):
            return torch.empty(n, k, device=DEVICE, dtype=self.dtype).normal_(0.0, k ** -0.5, generator=gen)

        def ones(n):
            return torch.ones(n, device=DEVICE, dtype=self.dtype)
        self.qkv_width = (s["heads"] + 2 * s["kv_heads"]) * hd
        self.layers = [{"in_norm": ones(s["hidden"]), "qkv": weight(self.qkv_width, s["hidden"]),
                        "o": weight(s["hidden"], s["heads"] * hd), "post_norm": ones(s["hidden"]),
                        "gate_up": weight(2 * s["inter"], s["hidden"]), "down": weight(s["hidden"], s["inter"])}
                       for _ in range(s["layers"])]
        self.embed, self.lm_head = weight(s["vocab"], s["hidden"]), weight(s["vocab"], s["hidden"])
        self.final_norm = ones(s["hidden"])
        self.cos_sin = torch.randn(ROPE_POSITIONS, hd, device=DEVICE, generator=gen).to(self.dtype)
        self.max_batch, self.max_tokens = max(BATCHES), max_tokens
        self.caches = [self.layer_cache() for _ in range(s["layers"])]

    def layer_cache(self):
        """One layer's K and V caches, each request's keys contiguous, as one zeroed tensor (unpacks to K, V)."""
        return self.torch.zeros(2, self.max_batch, self.max_tokens, self.s["kv_heads"], self.s["head_dim"],
                                device=DEVICE, dtype=self.dtype)

    def step(self, batch: int, context: int):
        """fn() running one decode step of `batch` requests, each with `context` tokens cached."""
        torch, s, hd = self.torch, self.s, self.s["head_dim"]
        ids = torch.randint(0, s["vocab"], (batch,), device=DEVICE)
        positions = torch.full((batch,), context, dtype=torch.long, device=DEVICE)
        used = torch.full((batch,), context + 1, dtype=torch.int32, device=DEVICE)
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE)
        meta = self.fa3.get_scheduler_metadata(batch, 1, context + 1, s["heads"], s["kv_heads"], hd, used,
                                               qkv_dtype=self.dtype, cu_seqlens_q=cu_q, page_size=None,
                                               causal=True, num_splits=GRAPH_MAX_SPLITS)
        q_width = s["heads"] * hd

        def attention(layer_cache, q, k, v):
            kc, vc = layer_cache
            kc[:batch, context] = k.view(batch, s["kv_heads"], hd)
            vc[:batch, context] = v.view(batch, s["kv_heads"], hd)
            out = self.fa3.flash_attn_with_kvcache(q.view(batch, s["heads"], hd), kc[:batch], vc[:batch],
                                                   cache_seqlens=used, cu_seqlens_q=cu_q, max_seqlen_q=1,
                                                   causal=True, scheduler_metadata=meta,
                                                   num_splits=GRAPH_MAX_SPLITS)
            return (out[0] if isinstance(out, tuple) else out).reshape(batch, q_width)
        return self.layers_around(ids, positions, attention)

    def layers_around(self, ids, positions, attention):
        """fn() running the step's embedding, layers and LM head, each layer's attention launch being
        `attention(layer_cache, q, k, v)` (it returns the output, rows x query width)."""
        ops, linear = self.ops, self.torch.nn.functional.linear
        q_width, kv_width = (n * self.s["head_dim"] for n in (self.s["heads"], self.s["kv_heads"]))

        def fn():
            x = ops["embedding"](ids, self.embed)
            residual = None
            for w, cache in zip(self.layers, self.caches):
                if residual is None:
                    h, residual = ops["rms_norm"](x, w["in_norm"]), x
                else:
                    h, residual = ops["add_rms_norm"](x, residual, w["in_norm"])
                q, k, v = linear(h, w["qkv"]).split((q_width, kv_width, kv_width), dim=-1)
                q, k = ops["rope"](q, k, positions, self.cos_sin)
                x = linear(attention(cache, q, k, v), w["o"])
                h, residual = ops["add_rms_norm"](x, residual, w["post_norm"])
                x = linear(ops["silu_mul"](linear(h, w["gate_up"])), w["down"])
            h, _ = ops["add_rms_norm"](x, residual, self.final_norm)
            return linear(h, self.lm_head).argmax(dim=-1)
        return fn


def tune(torch, ops, rank: Rank) -> None:
    """Compile the elementwise ops at the largest batch with the token count symbolic (as vLLM's compile
    run does), then run each step size once eagerly."""
    s, t = rank.s, rank.max_batch
    x = torch.randn(t, s["hidden"], device=DEVICE, dtype=rank.dtype)
    gu = torch.randn(t, 2 * s["inter"], device=DEVICE, dtype=rank.dtype)
    q = torch.randn(t, s["heads"] * s["head_dim"], device=DEVICE, dtype=rank.dtype)
    k = torch.randn(t, s["kv_heads"] * s["head_dim"], device=DEVICE, dtype=rank.dtype)
    pos = torch.randint(0, ROPE_POSITIONS, (t,), device=DEVICE)
    ids = torch.randint(0, s["vocab"], (t,), device=DEVICE)
    for tensor in (x, gu, q, k, pos, ids):
        torch._dynamo.mark_dynamic(tensor, 0)
    ops["rms_norm"](x, rank.final_norm)
    ops["add_rms_norm"](x, x, rank.final_norm)
    ops["silu_mul"](gu)
    ops["rope"](q, k, pos, rank.cos_sin)
    ops["embedding"](ids, rank.embed)


def time_step(torch, fn) -> tuple[float, float, float]:
    """(median, p10, p90) seconds of one CUDA-graph replay of fn, over REPLAYS replays after three."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    samples = []
    for i in range(3 + REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if i >= 3:
            samples.append(start.elapsed_time(end) / 1e3)
    samples.sort()
    del graph
    return statistics.median(samples), samples[len(samples) // 10], samples[(9 * len(samples)) // 10]


def for_each_rank(torch, ranks, budget_s: float, make_rank, measure_rank) -> None:
    """`measure_rank(model, tp, shapes, rank)` for each of `ranks` started within `budget_s` seconds, the
    rank built by `make_rank(ops, shapes)` with the elementwise ops compiled and tuned (`tune`), and
    freed before the next is built (two ranks of 70B do not fit an H100 together)."""
    from kernels_cost_model.models import get_model
    from kernels_cost_model.torch_backend import _elementwise_ops
    started = time.perf_counter()
    for model, tp in ranks:
        if time.perf_counter() - started > budget_s:
            print(f"budget spent: {model} TP {tp} not measured", flush=True)
            return
        shapes = rank_shapes(get_model(model), tp)
        ops = _elementwise_ops(torch, compiled=True)
        rank = make_rank(ops, shapes)
        tune(torch, ops, rank)
        measure_rank(model, tp, shapes, rank)
        del rank
        torch.cuda.empty_cache()


@contextmanager
def measured_csv(torch, path: Path, columns: tuple, what: str):
    """(csv writer, file, source column) of a new measurement file at `path` with its header, in torch's
    inference mode; the source names servesim, the date, the software, the device and `what`."""
    from kernels_cost_model.torch_backend import software
    path.parent.mkdir(parents=True, exist_ok=True)
    source = (f"servesim {datetime.date.today().isoformat()} ({software(torch)}, {torch.cuda.get_device_name(0)}; "
              f"{what})")
    with path.open("w", newline="") as f, torch.inference_mode():
        writer = csv.writer(f)
        writer.writerow(columns)
        yield writer, f, source


def measure(gpu: str, out_dir: Path, budget_s: float) -> Path:
    import torch
    import fa3_fwd_interface as fa3
    started = time.perf_counter()
    path = out_dir / f"{gpu}-decode-steps.csv"
    with measured_csv(torch, path, COLUMNS, "fa3_fwd; one rank composed of the kernels vLLM runs, KV contiguous, "
                      "CUDA graph per step") as (writer, f, source):

        def measure_rank(model, tp, shapes, rank):
            for context in CONTEXTS:
                for batch in BATCHES:
                    med, p10, p90 = time_step(torch, rank.step(batch, context))
                    writer.writerow((model, tp, shapes["layers"], batch, context, med, p10, p90, gpu, source))
                    f.flush()
                    print(f"{model} TP{tp} batch {batch} context {context}: {med * 1e3:.3f} ms "
                          f"(p10 {p10 * 1e3:.3f}, p90 {p90 * 1e3:.3f}) at {time.perf_counter() - started:.0f} s",
                          flush=True)
        for_each_rank(torch, RANKS, budget_s, lambda ops, shapes: Rank(torch, fa3, ops, shapes, max(CONTEXTS) + 1),
                      measure_rank)
    return path


def read(path: Path) -> list[dict]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for key in ("tp", "layers", "batch", "context"):
            r[key] = int(r[key])
        for key in ("measured_s", "p10_s", "p90_s"):
            r[key] = float(r[key])
    return rows


def priced_parts(row: dict, gpu: str, clocks: str = "burst") -> dict:
    """servesim's step for the row's batch on `gpu` (shipped calibration, CUDA graphs, no CPU time, at
    `clocks`) by operator (`breakdown`)."""
    from kernels_cost_model.batch import BatchShape
    from kernels_cost_model.builder import make_cost_model
    cm = make_cost_model(row["model"], gpu, row["tp"], cpu_overhead=False, max_num_seqs=256, clocks=clocks)
    return cm.breakdown(BatchShape([1] * row["batch"], [row["context"]] * row["batch"], row["batch"]))


def priced(row: dict, gpu: str, clocks: str = "burst") -> float:
    """The step of `priced_parts` less the collectives one rank would wait for."""
    return sum(v for k, v in priced_parts(row, gpu, clocks).items() if not any(c in k for c in COLLECTIVE_TERMS))


def check() -> None:
    from kernels_cost_model.gpu_calibration import MEASURED_DIR
    for gpu in GPUS:
        path = MEASURED_DIR / f"{gpu}-decode-steps.csv"
        if not path.is_file():
            continue
        print(f"-- {gpu}: priced step (less collectives) against the measured composed step")
        print(f"   {'model':14s} {'tp':>2s} {'context':>7s} {'batch':>5s} {'measured ms':>11s} {'priced ms':>9s} "
              f"{'error':>7s}")
        errors = []
        for r in read(path):
            p = priced(r, gpu)
            errors.append(p / r["measured_s"] - 1.0)
            print(f"   {r['model']:14s} {r['tp']:2d} {r['context']:7d} {r['batch']:5d} {r['measured_s'] * 1e3:11.3f} "
                  f"{p * 1e3:9.3f} {100 * errors[-1]:+6.1f}%")
        print(f"   median |error| {100 * statistics.median(abs(e) for e in errors):.1f} %, "
              f"median {100 * statistics.median(errors):+.1f} %")


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    return measure_or_check_parser(__doc__.splitlines()[0], "steps", 300.0, "no further rank is started")


def main(argv: list[str] | None = None) -> int:
    return measure_or_check(build_parser(), argv, measure, check)


if __name__ == "__main__":
    raise SystemExit(main())
