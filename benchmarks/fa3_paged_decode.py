"""FlashAttention-3's paged decode on Hopper, as vLLM runs it: a measured grid and skewed batches.

    python benchmarks/fa3_paged_decode.py                                      # the check (no GPU)
    python benchmarks/fa3_paged_decode.py --measure --gpu h100-sxm --out DIR   # on a Hopper GPU with fa3_fwd

vLLM's FLASH_ATTN backend on Hopper runs every attention launch as one varlen call of FA3 over the
paged cache (16-token blocks read in place through the block table, `seqused_k` per request). A
decode-only batch of up to the largest capture size runs in a full CUDA graph, with FA3's scheduler
metadata computed ahead and at most 32 KV splits (`flash_attn_max_num_splits_for_cuda_graph`,
vllm/config/attention.py; vllm/v1/attention/backends/flash_attn.py, vLLM 0.19.1); other launches
take FA3's own split heuristic. `--measure` times, through the torch backend's CUDA-graph timer:

- `<gpu>-fa3-decode.profile.csv`: decodes of equal context, per head layout, over batch x context
  (profile rows; the full-graph call) and `<gpu>-fa3-decode-eager.profile.csv` (the heuristic call);
- `<gpu>-fa3-skew.csv`: batches whose contexts differ, in LLMServingSim's `skew.csv` columns, so
  alpha = (t_skew - t_mean) / (t_max - t_mean) reads as the FA2 GPUs' does (`regime` pure: decodes
  alone; mixed: beside a prefill chunk in the same launch).

The check (no GPU) prints, per GPU: the shipped calibration against the measured decode grid by size of
KV read (in L2, up to 1 GB, beyond), for both call forms, and how well a repeat agrees; and, for the
skewed batches, the median |error| of the launch priced at its mean context (alpha = 0) against priced
with the alphas of the other Hopper GPU (held out) or of the FA2 GPUs (`decode_imbalance.csv`).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import json
import math
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: (model whose head layout is measured, query heads, KV heads): GQA 4:1, MHA, GQA 7:1, GQA 8:1
LAYOUTS = (("llama-3.1-8b", 32, 8), ("llama-2-7b", 32, 32), ("qwen2.5-7b", 28, 4), ("qwen3-32b", 64, 8))
SKEW_LAYOUTS = LAYOUTS[:2]
BATCHES = (1, 4, 8, 16, 32, 64, 128, 256)
CONTEXTS = (128, 512, 1024, 2048, 4096, 8192)
HEAD_DIM = 128
BLOCK = 16
#: vLLM 0.19.1 AttentionConfig.flash_attn_max_num_splits_for_cuda_graph (vllm/config/attention.py)
GRAPH_MAX_SPLITS = 32
#: vLLM's largest default CUDA-graph capture size (tokens) at max_num_seqs 256
GRAPH_MAX_TOKENS = 512
SKEW_N = (2, 4, 8, 16, 32, 64, 128, 256)
SKEW_SMALL = (128, 512, 2048)
SKEW = 4
MIXED_N = (4, 16, 64, 128)
MIXED_SMALL = (512,)
MIXED_CHUNKS = ((128, 0), (512, 0), (2048, 0), (512, 4096))
MAX_KV_BYTES = 16e9
SKEW_COLUMNS = ("model", "num_heads", "num_kv_heads", "regime", "n", "nb", "ratio", "skew", "pc", "kp", "kvs",
                "kv_big", "kv_mean", "t_mean_us", "t_max_us", "t_skew_us", "alpha", "device", "source")
GPUS = ("h100-sxm", "h200")
DEVICE = "cuda"


def kv_bytes(kvh: int, keys: int) -> float:
    return 2.0 * keys * kvh * HEAD_DIM * 2


def big_counts(n: int) -> list[int]:
    """Rows at the long context in a skewed batch of `n`: one, an eighth, a quarter, half, three quarters."""
    return sorted({c for c in (1, n // 8, n // 4, n // 2, 3 * n // 4) if 1 <= c < n})


class Launcher:
    """Builds one FA3 varlen launch as vLLM calls it: over a paged cache (blocks in random order) where the
    fa3_fwd build reads paged KV, else over each request's keys contiguous (`paged` False)."""

    def __init__(self, torch, fa3):
        self.torch, self.fa3 = torch, fa3
        self.gen = torch.Generator(device=DEVICE).manual_seed(0)
        self.cpu_gen = torch.Generator(device="cpu").manual_seed(1)
        self.paged, self.metadata, self.last = True, True, None

    def rand(self, *shape):
        return self.torch.randn(*shape, generator=self.gen, device=DEVICE, dtype=self.torch.bfloat16)

    def _cache(self, kvh: int, keys: list[int]):
        """(K cache, V cache, block table or None, gather(i) -> request i's keys' (K, V))."""
        torch = self.torch
        if not self.paged:
            longest = math.ceil(max(keys) / BLOCK) * BLOCK
            kc, vc = self.rand(len(keys), longest, kvh, HEAD_DIM), self.rand(len(keys), longest, kvh, HEAD_DIM)
            return kc, vc, None, lambda i: (kc[i, :keys[i]], vc[i, :keys[i]])
        blocks = [math.ceil(k / BLOCK) for k in keys]
        kc, vc = self.rand(sum(blocks) + 1, BLOCK, kvh, HEAD_DIM), self.rand(sum(blocks) + 1, BLOCK, kvh, HEAD_DIM)
        order = torch.randperm(sum(blocks), generator=self.cpu_gen).to(torch.int32)
        table = torch.zeros(len(keys), max(blocks), dtype=torch.int32)
        for i, start in enumerate(itertools.accumulate([0, *blocks[:-1]])):
            table[i, :blocks[i]] = order[start:start + blocks[i]]
        table = table.to(DEVICE)

        def gather(i):
            rows = table[i, :blocks[i]].long()
            return (kc[rows].reshape(-1, kvh, HEAD_DIM)[:keys[i]], vc[rows].reshape(-1, kvh, HEAD_DIM)[:keys[i]])
        return kc, vc, table, gather

    def make(self, nh: int, kvh: int, queries: list[int], keys: list[int], graph: bool):
        """fn() running the launch: request i has queries[i] new tokens and attends keys[i] keys."""
        torch = self.torch
        kc, vc, table, gather = self._cache(kvh, keys)
        q = self.rand(sum(queries), nh, HEAD_DIM)
        cu_q = torch.tensor([0, *itertools.accumulate(queries)], dtype=torch.int32, device=DEVICE)
        used = torch.tensor(keys, dtype=torch.int32, device=DEVICE)
        splits = GRAPH_MAX_SPLITS if graph and sum(queries) <= GRAPH_MAX_TOKENS else 0
        meta = self.fa3.get_scheduler_metadata(
            len(keys), max(queries), max(keys), nh, kvh, HEAD_DIM, used, qkv_dtype=torch.bfloat16,
            cu_seqlens_q=cu_q, page_size=BLOCK if self.paged else None, causal=True,
            num_splits=splits) if graph and self.metadata else None
        self.last = (q, cu_q, gather)

        def fn():
            return self.fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=used, page_table=table,
                                                    cu_seqlens_q=cu_q, max_seqlen_q=max(queries), causal=True,
                                                    scheduler_metadata=meta, num_splits=splits)
        return fn

    def choose_form(self) -> str:
        """Fall back from paged KV, then from scheduler metadata, where this build refuses them."""
        for paged, metadata in ((True, True), (True, False), (False, True), (False, False)):
            self.paged, self.metadata = paged, metadata
            try:
                self.make(32, 8, [1, 1], [100, 40], True)()
                self.torch.cuda.synchronize()
                break
            except RuntimeError as exc:
                print(f"paged={paged} metadata={metadata}: {str(exc).splitlines()[-1]}", flush=True)
        return (("paged KV (16-token blocks, random order)" if self.paged else
                 "KV contiguous per request (this fa3_fwd build reads no paged KV; vLLM reads 16-token blocks)")
                + ("" if self.metadata else ", no scheduler metadata"))


def reference_check(torch, launcher) -> float:
    """FA3 launches against SDPA on the same keys (bf16): decodes and a chunk, both call forms."""
    from torch.nn.attention.bias import causal_lower_right
    worst = 0.0
    for nh, kvh, queries, keys, graph in ((32, 8, [1, 1, 1], [1000, 37, 4000], True),
                                          (28, 4, [1, 1, 64], [500, 3000, 640], False),
                                          (32, 32, [1, 1], [17, 5000], True)):
        got = launcher.make(nh, kvh, queries, keys, graph)()
        got = got[0] if isinstance(got, tuple) else got
        q, cu_q, gather = launcher.last
        for i, (nq, nk) in enumerate(zip(queries, keys)):
            k, v = gather(i)
            qi = q[cu_q[i]:cu_q[i + 1]]
            want = torch.nn.functional.scaled_dot_product_attention(
                qi.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
                attn_mask=causal_lower_right(nq, nk), enable_gqa=kvh != nh).squeeze(0).transpose(0, 1)
            worst = max(worst, (got[cu_q[i]:cu_q[i + 1]].float() - want.float()).abs().max().item())
    return worst


def measure_grid(torch, launcher, timer, gpu: str, source: str, graph: bool, layouts=LAYOUTS) -> list[dict]:
    """Profile rows of equal-context decodes (context = cached keys; each attends context + 1)."""
    from kernels_cost_model.profile_schema import validate_row
    kernel = ("FlashAttention-3 paged varlen (fa3_fwd), full CUDA graph: scheduler metadata, <= 32 splits"
              if graph else "FlashAttention-3 paged varlen (fa3_fwd), splits by its heuristic")
    rows = []
    for _model, nh, kvh in layouts:
        for batch, ctx in itertools.product(BATCHES, CONTEXTS):
            if kv_bytes(kvh, batch * (ctx + 1)) > 2 * MAX_KV_BYTES:
                continue
            seconds = timer(lambda: launcher.make(nh, kvh, [1] * batch, [ctx + 1] * batch, graph),
                            kv_bytes(kvh, batch * (ctx + 1)))
            rows.append(validate_row({"operator": "decode_attention", "batch": batch, "context": ctx,
                                      "num_heads": nh, "num_kv_heads": kvh, "head_dim": HEAD_DIM,
                                      "dtype": "bfloat16", "measured_s": seconds, "device": gpu,
                                      "source": f"{source}; {kernel}"}, "<fa3 paged decode>"))
            torch.cuda.empty_cache()
    return rows


def skew_shots() -> list[tuple]:
    """(model, heads, KV heads, regime, n, nb, kvs, pc, kp) of every skewed batch."""
    shots = []
    for model, nh, kvh in SKEW_LAYOUTS:
        for n, kvs in itertools.product(SKEW_N, SKEW_SMALL):
            if kv_bytes(kvh, n * SKEW * kvs) <= MAX_KV_BYTES:
                shots += [(model, nh, kvh, "pure", n, nb, kvs, 0, 0) for nb in big_counts(n)]
        for n, kvs, (pc, kp) in itertools.product(MIXED_N, MIXED_SMALL, MIXED_CHUNKS):
            shots += [(model, nh, kvh, "mixed", n, nb, kvs, pc, kp) for nb in (n // 4, n // 2)]
    return shots


def measure_skew(torch, launcher, timer, gpu: str, source: str, path: Path) -> None:
    """Time each skewed batch, the same batch at the mean context and at the long one, into `path`."""
    cache: dict[tuple, float] = {}

    def timed(nh, kvh, n_decodes, keys_list, pc, kp):
        key = (nh, kvh, tuple(keys_list), pc, kp)
        if key not in cache:
            queries = [1] * n_decodes + ([pc] if pc else [])
            keys = list(keys_list) + ([kp + pc] if pc else [])
            cache[key] = timer(lambda: launcher.make(nh, kvh, queries, keys, True), kv_bytes(kvh, sum(keys)))
            torch.cuda.empty_cache()
        return cache[key]

    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(SKEW_COLUMNS)
        for model, nh, kvh, regime, n, nb, kvs, pc, kp in skew_shots():
            big = SKEW * kvs
            mean = (nb * big + (n - nb) * kvs) / n
            t_skew = timed(nh, kvh, n, (big,) * nb + (kvs,) * (n - nb), pc, kp)
            t_mean = timed(nh, kvh, n, (round(mean),) * n, pc, kp)
            t_max = timed(nh, kvh, n, (big,) * n, pc, kp)
            alpha = (t_skew - t_mean) / (t_max - t_mean) if t_max > t_mean else float("nan")
            writer.writerow((model, nh, kvh, regime, n, nb, round(nb / n, 4), float(SKEW), pc, kp, kvs, big,
                             round(mean), round(t_mean * 1e6, 3), round(t_max * 1e6, 3), round(t_skew * 1e6, 3),
                             round(alpha, 4), gpu, source))
            f.flush()


def measure(gpu: str, out_dir: Path, budget_s: float) -> None:
    import torch
    import fa3_fwd_interface as fa3
    from kernels_cost_model.profile_schema import write_profile
    from kernels_cost_model.torch_backend import software
    from kernels_cost_model.torch_timing import cuda_timer
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    device = torch.cuda.get_device_name(0)
    env = {"date": datetime.date.today().isoformat(), "device": device, "software": f"{software(torch)}, fa3_fwd",
           "multiprocessors": props.multi_processor_count, "l2_bytes": props.L2_cache_size,
           "memory_bytes": props.total_memory, "capability": f"{props.major}.{props.minor}"}
    launcher = Launcher(torch, fa3)
    env["kv_form"] = launcher.choose_form()
    err = reference_check(torch, launcher)
    env["reference_check_max_abs_diff"] = err
    print(json.dumps(env), flush=True)
    if err > 0.05:
        raise SystemExit(f"paged FA3 disagrees with SDPA by {err}; not timing it")
    source = f"servesim {env['date']} ({env['software']}, {device}; {env['kv_form']})"
    timer, quick_timer = cuda_timer(torch, "cuda", 3, 10), cuda_timer(torch, "cuda", 2, 5)
    runs = []

    def done(what: str) -> None:
        runs.append(f"{what} by {time.perf_counter() - started:.0f} s")
        print(runs[-1], flush=True)
        env["runs"] = "; ".join(runs)
        (out_dir / f"{gpu}-fa3-decode.env.json").write_text(json.dumps(env, indent=1) + "\n")

    with torch.inference_mode():
        rows = measure_grid(torch, launcher, timer, gpu, source, True)
        write_profile(rows, out_dir / f"{gpu}-fa3-decode.profile.csv")
        done(f"full-graph grid: {len(rows)} kernels (median of 10 replays)")
        measure_skew(torch, launcher, quick_timer, gpu, source, out_dir / f"{gpu}-fa3-skew.csv")
        done("skewed batches (median of 5 replays)")
        if time.perf_counter() - started < budget_s:
            rows = measure_grid(torch, launcher, quick_timer, gpu, source, False)
            write_profile(rows, out_dir / f"{gpu}-fa3-decode-eager.profile.csv")
            done(f"heuristic-split grid: {len(rows)} kernels (median of 5 replays)")
        if time.perf_counter() - started < budget_s:
            rows = measure_grid(torch, launcher, timer, gpu, source, True, LAYOUTS[:1])
            write_profile(rows, out_dir / f"{gpu}-fa3-decode.repeat.profile.csv")
            done(f"repeat of the first layout's full-graph grid: {len(rows)} kernels")


KV_BANDS = ((0.0, 64e6, "in L2 (< 64 MB)"), (64e6, 1e9, "64 MB - 1 GB"), (1e9, math.inf, ">= 1 GB"))
N_BANDS = ((2, 16), (32, 256))


def profile_path(gpu: str, name: str) -> Path:
    from kernels_cost_model.gpu_calibration import MEASURED_DIR
    return MEASURED_DIR / f"{gpu}-fa3-{name}.profile.csv"


def decode_errors(gpu: str, name: str) -> list[tuple]:
    """(band, rows, median |error|, median signed error, median priced - measured in us) of the shipped
    calibration on `gpu`'s measured decode grid `name` (decode, decode-eager), per KV band."""
    import numpy as np
    from kernels_cost_model.calibration import predict, shipped_calibration
    from kernels_cost_model.profile_schema import read_profile
    rows = read_profile(profile_path(gpu, name))
    priced = predict(rows, shipped_calibration(gpu))
    measured = np.array([r["measured_s"] for r in rows])
    kv = np.array([kv_bytes(r["num_kv_heads"], r["batch"] * (r["context"] + 1)) for r in rows])
    out = []
    for lo, hi, band in KV_BANDS:
        sel = (kv >= lo) & (kv < hi)
        err = priced[sel] / measured[sel] - 1.0
        out.append((band, int(sel.sum()), float(np.median(np.abs(err))), float(np.median(err)),
                    float(np.median(priced[sel] - measured[sel]) * 1e6)))
    return out


def repeat_difference(gpu: str) -> float:
    """Median |repeat / first - 1| over the kernels both full-graph runs timed."""
    from kernels_cost_model.profile_schema import read_profile

    def key(r):
        return r["num_heads"], r["num_kv_heads"], r["batch"], r["context"]
    first = {key(r): r["measured_s"] for r in read_profile(profile_path(gpu, "decode"))}
    return median(abs(r["measured_s"] / first[key(r)] - 1.0)
                  for r in read_profile(profile_path(gpu, "decode.repeat")))


def skew_errors(gpu: str, donor: str | None) -> dict[tuple, tuple[int, float]]:
    """{(regime, n band): (shots, median |priced / measured - 1|)} of `gpu`'s skewed batches priced as
    t_mean + alpha (t_max - t_mean), alpha from `donor`'s rows of decode_imbalance.csv (None: 0)."""
    from kernels_cost_model.attention_backend import REGIMES, decode_imbalance, imbalance_alpha
    from kernels_cost_model.gpu_calibration import MEASURED_DIR
    points = decode_imbalance(donor) if donor else None
    errors: dict[tuple, list] = {}
    with (MEASURED_DIR / f"{gpu}-fa3-skew.csv").open() as f:
        for r in csv.DictReader(f):
            n = int(r["n"])
            t_mean, t_max, t_skew = (float(r[c]) for c in ("t_mean_us", "t_max_us", "t_skew_us"))
            alpha = imbalance_alpha(points[REGIMES.index(r["regime"])], n) if points else 0.0
            band = next(b for b in N_BANDS if b[0] <= n <= b[1])
            errors.setdefault((r["regime"], band), []).append(abs((t_mean + alpha * (t_max - t_mean)) / t_skew - 1))
    return {k: (len(v), median(v)) for k, v in sorted(errors.items())}


def check() -> None:
    for gpu in GPUS:
        print(f"-- {gpu}: shipped calibration against FlashAttention-3 decodes (repeat within "
              f"{100 * repeat_difference(gpu):.1f} % at the median)")
        for name, form in (("decode", "full graph"), ("decode-eager", "heuristic splits")):
            for band, n, abs_err, signed, diff_us in decode_errors(gpu, name):
                print(f"   {form:16s} {band:16s} {n:4d} kernels  |err| {100 * abs_err:5.1f} %  signed "
                      f"{100 * signed:+6.1f} %  priced - measured {diff_us:+7.1f} us")
        other = next(g for g in GPUS if g != gpu)
        base, held, fa2 = skew_errors(gpu, None), skew_errors(gpu, other), skew_errors(gpu, "rtx-pro-6000")
        print(f"   skewed batches, median |error|: alpha = 0 / {other}'s alphas (held out) / rtx-pro-6000's (FA2)")
        for key, (shots, err) in base.items():
            print(f"   {key[0]:5s} n = {key[1][0]}-{key[1][1]:<3d} {shots:4d} shots  {100 * err:5.1f} % / "
                  f"{100 * held[key][1]:5.1f} % / {100 * fa2[key][1]:5.1f} %")


def measure_or_check_parser(description: str, measured: str, budget_s: float, budget: str):
    """The command line of a script that measures on a GPU with --measure and checks without one."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--measure", action="store_true", help=f"time the {measured} on this machine's Hopper GPU")
    parser.add_argument("--gpu", default="", help="catalog name written in the device column (with --measure)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the measured files (with --measure)")
    parser.add_argument("--budget-s", type=float, default=budget_s,
                        help=f"seconds after which {budget} (with --measure)")
    return parser


def measure_or_check(parser, argv, measure_fn, check_fn) -> int:
    """Run `measure_fn(gpu, out, budget_s)` with --measure (which needs --gpu and --out), else `check_fn()`."""
    args = parser.parse_args(argv)
    if not args.measure:
        check_fn()
    elif not args.gpu or args.out is None:
        parser.error("--measure needs --gpu and --out")
    else:
        measure_fn(args.gpu, args.out, args.budget_s)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    return measure_or_check_parser(__doc__.splitlines()[0], "grid", 240.0, "the optional repeat is skipped")


def main(argv: list[str] | None = None) -> int:
    return measure_or_check(build_parser(), argv, measure, check)


if __name__ == "__main__":
    raise SystemExit(main())
