"""KV capacity and decode speed of the models beyond plain attention, one GPU each (TP where one GPU cannot hold it).

    python benchmarks/model_shapes.py [--gpu h200] [--length 8192] [--batch 64]

Per model: weights per GPU, KV pool blocks and the tokens vLLM would report, requests of `--length`
tokens that fit at once (sliding windows and linear states counted as vLLM's hybrid manager holds
them), and the decode step time at batch 1 and `--batch` with `--length` tokens of context; for MoE
models that need several GPUs, the `--batch` step under TP against DP + EP on the same GPUs.
Sources: shapes from each model's config.json (kernels_cost_model/data/models_modern.json, URL per
model); memory from the GPU catalog (gpus.csv, datasheets) and vLLM's sizing rule (kv_memory.py);
step time from the roofline cost model (shipped calibration where one exists for the GPU, else
datasheet peaks x default efficiencies) with the per-layer-type operators of layer_ops.py, and the
measured MLA / FP8 GEMM / MoE fits of data/calibration_modern/<gpu>.json where they apply (listed per
model with their held-out error).
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_cost_model import get_model, kv_cache_blocks, kv_layout, make_cost_model  # noqa: E402
from kernels_cost_model._catalog import read_config_catalog  # noqa: E402
from kernels_cost_model.batch import BatchShape  # noqa: E402
from kernels_cost_model.errors import ConfigError  # noqa: E402
from kernels_cost_model.expert_parallel import ExpertParallelCostModel  # noqa: E402
from kernels_cost_model.kv_memory import weight_bytes_per_gpu  # noqa: E402
from kernels_cost_model.modern_kernels import GRAPHED_GEMM, load_modern, weight_variant  # noqa: E402


def smallest_tp(name: str, gpu: str, kv_cache_dtype: str) -> int | None:
    for tp in (1, 2, 4, 8):
        try:
            kv_cache_blocks(name, gpu, tp, kv_cache_dtype=kv_cache_dtype)
            return tp
        except ConfigError:
            continue
    return None


def row(name: str, gpu: str, length: int, batch: int, kv_cache_dtype: str) -> str:
    tp = smallest_tp(name, gpu, kv_cache_dtype)
    if tp is None:
        return f"{name:24} does not fit on 8 x {gpu} (weights {weight_bytes_per_gpu(name, 8, gpu) / 2**30:.1f} GiB per GPU)"
    blocks = kv_cache_blocks(name, gpu, tp, kv_cache_dtype=kv_cache_dtype)
    layout = kv_layout(name, tp, 16, kv_cache_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost = make_cost_model(name, gpu, tp, kv_cache_dtype=kv_cache_dtype)
    step = [cost.step_time(BatchShape(num_new_tokens=[1] * n, num_context_tokens=[length] * n, num_sampled=n))
            for n in (1, batch)]
    return (f"{name:24} {tp:>3} {weight_bytes_per_gpu(name, tp, gpu) / 2**30:>8.1f} {len(layout.groups):>6} "
            f"{blocks:>9,} {layout.tokens(blocks):>11,} {layout.max_concurrency(blocks, length):>9,} "
            f"{step[0] * 1e3:>9.2f} {step[1] * 1e3:>10.2f}")


def step_sources(name: str, gpu: str, kv_cache_dtype: str) -> str:
    """Which measured fits price this model's step on this GPU (the rest is the roofline)."""
    fits, spec = load_modern(gpu), get_model(name)
    if fits is None:
        return "roofline only (no modern fits for this GPU)"
    raw, variant, out = fits["_raw"], weight_variant(spec), []
    if spec.is_mla:
        kv = "fp8" if kv_cache_dtype == "fp8" else "bfloat16"
        g = "fp8_block" if variant.startswith("fp8") else "bfloat16"
        key = next((k for k in (f"generation/{kv}/{g}", f"generation/{kv}/bfloat16") if k in raw["mla"]), None)
        if key:
            out.append(f"MLA {key} ({raw['mla'][key]['holdout_error']['median']:.1%})")
    gemm = GRAPHED_GEMM.get(variant, variant)
    if variant.startswith("fp8") and gemm in raw["gemm"]:
        out.append(f"GEMM {gemm} ({raw['gemm'][gemm]['holdout_error']['median']:.1%})")
    if spec.is_moe and variant != "bfloat16" and variant in raw["moe"]:
        out.append(f"MoE {variant} ({raw['moe'][variant]['holdout_error']['median']:.1%})")
    if spec.num_linear_layers and "generation" in raw.get("gdn", {}):
        out.append(f"GDN generation ({raw['gdn']['generation']['holdout_error']['median']:.1%})")
    if not out:
        return "roofline with the shipped bf16 calibration (no modern fit applies)"
    return f"calibration_modern/{gpu}.json: {', '.join(out)} (held-out median error)"


def dp_ep_row(name: str, gpu: str, length: int, batch: int) -> str | None:
    """Decode step of `batch` requests on tp GPUs: TP (experts split) against DP + EP lockstep ranks
    (one engine per GPU, experts sharded, token exchange per MoE layer; expert_parallel.py)."""
    tp = smallest_tp(name, gpu, "auto")
    if not get_model(name).is_moe or not tp or tp == 1 or batch % tp:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tp_cost, one = make_cost_model(name, gpu, tp), make_cost_model(name, gpu, 1)
    total = tp_cost.step_time(BatchShape([1] * batch, [length] * batch, batch))
    per = batch // tp
    ep = ExpertParallelCostModel(one, tp).step_time([BatchShape([1] * per, [length] * per, per)] * tp)
    return f"  {name:24} TP{tp}: {total * 1e3:7.2f} ms   DP{tp}+EP{tp}: {ep * 1e3:7.2f} ms"


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="h200")
    p.add_argument("--length", type=int, default=8192)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"))
    return p


def main(argv: list[str] | None = None) -> None:
    p = build_parser()
    a = p.parse_args(argv)
    print(f"{a.gpu}, gpu_memory_utilization 0.9, block_size 16, kv_cache_dtype {a.kv_cache_dtype}; "
          f"requests of {a.length} tokens; decode steps at {a.length} context")
    print(f"{'model':24} {'tp':>3} {'GiB/GPU':>8} {'groups':>6} {'blocks':>9} {'KV tokens':>11} "
          f"{'max reqs':>9} {'step@1 ms':>9} {f'step@{a.batch} ms':>10}")
    for entry in read_config_catalog("models_modern.json"):
        print(row(entry["name"], a.gpu, a.length, a.batch, a.kv_cache_dtype))
    print(f"\ndecode step of {a.batch} requests at {a.length} context, TP against DP + EP on the same GPUs:")
    for entry in read_config_catalog("models_modern.json"):
        line = dp_ep_row(entry["name"], a.gpu, a.length, a.batch)
        if line:
            print(line)
    print("\nsources (shape; step-time fits):")
    for entry in read_config_catalog("models_modern.json"):
        print(f"  {entry['name']}: {get_model(entry['name']).source}")
        print(f"  {'':{len(entry['name'])}}  {step_sources(entry['name'], a.gpu, a.kv_cache_dtype)}")


if __name__ == "__main__":
    main()
