"""Run vLLM's own KV sizing functions on spec objects built from servesim's model shapes.

Run with a vLLM install (CPU is enough, VLLM_TARGET_DEVICE=cpu): `python this.py 0.19 models.json out.json` (or 0.33). It
reads models.json (each hybrid catalog model's layer_types, KV heads, head_dim, dtype bytes, window and
linear-attention shape, from kernels_cost_model.models.get_model) and writes out.json,
which tests/data/vllm_hybrid_kv_sizing.json holds for both releases (tests/test_hybrid_kv_sizing.py).

With `--drafters` it writes the rows of targets with a drafter's layers instead (DRAFTERS): an EAGLE,
EAGLE-3 or MTP head adds one full-attention layer of the target's KV shape (the same spec, so it joins
the target's full-attention layers), and under speculative decoding a linear-attention layer's state
spec asks for k more state blocks (MambaSpec.num_speculative_blocks). Llama-4 with EAGLE runs with the
manager off in both releases (chunked local attention with EAGLE-style drafts), so only those rows.
"""
import argparse
import json
import types


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", choices=["0.19", "0.33"])
    parser.add_argument("models_path")
    parser.add_argument("out_path")
    parser.add_argument("--drafters", action="store_true", help="rows of targets with a drafter's layers")
    return parser


#: target -> (method, drafter layers, drafts per step k tried, manager settings tried)
DRAFTERS = {"gpt-oss-120b": ("eagle3", 1, (3,), (False, True)),
            "gpt-oss-20b": ("eagle3", 1, (3,), (False, True)),
            "gemma-3-27b": ("eagle", 1, (3,), (False, True)),
            "qwen3-next-80b-a3b": ("mtp", 1, (1, 3), (False, True)),
            "llama-4-scout": ("eagle", 1, (3,), (True,))}


def run(REL: str, models_path: str, out_path: str, drafters: bool = False) -> None:
    import torch
    if REL == "0.19":
        from vllm.v1.core import kv_cache_utils as plan
        get_conc = plan.get_max_concurrency_for_kv_cache_config
    else:
        from vllm.v1.core import kv_cache_planning as plan
        from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config as get_conc
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator
    from vllm.utils.math_utils import cdiv

    DT = {2: torch.bfloat16, 1: torch.float8_e4m3fn, 4: torch.float32}
    GIB = 1 << 30

    def cfg(max_model_len, mnbt, disable, is_async=True):
        ns = types.SimpleNamespace
        cache = ns(mamba_cache_mode="none", kv_cache_layout="NHD", prefix_cache_retention_interval=None,
                   num_gpu_blocks_override=None)
        cache.get_resolved_kv_cache_layout = lambda: __import__("vllm.config.cache", fromlist=["x"])._layout_from_name("NHD")
        return ns(max_in_flight_tokens=mnbt * (2 if is_async else 1), model_config=ns(max_model_len=max_model_len),
                  scheduler_config=ns(max_num_batched_tokens=mnbt, disable_hybrid_kv_cache_manager=disable),
                  parallel_config=ns(decode_context_parallel_size=1, prefill_context_parallel_size=1),
                  cache_config=cache, attention_config=ns(hisparse_config=None))

    def specs(m, tp, block_size, kv_bytes=None, draft_layers=0, k=0):
        heads = max(1, m["kv_heads"] // tp)
        dt = DT[kv_bytes or m["dtype_bytes"]]
        attn1 = FullAttentionSpec(block_size=1, num_kv_heads=heads, head_size=m["head_dim"], dtype=dt).page_size_bytes
        mamba_page, bs, pad = 0, block_size, None
        if "linear_attention" in m["layer_types"]:
            shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(tp, m["lk"], m["lv"], m["lkd"], m["lvd"], m["conv"], 0)
            mdt = DT[m["dtype_bytes"]]
            mamba_page = MambaSpec(shapes=shapes, dtypes=(mdt, DT[m["ssm"] or m["dtype_bytes"]]), block_size=-1).page_size_bytes
            # the config hook (0.19 HybridAttentionMambaModelConfig / 0.33 Platform._align_hybrid_block_size),
            # mamba_cache_mode "none", FlashAttention's 16-token kernel alignment
            bs = max(block_size, 16 * cdiv(mamba_page, 16 * attn1))
            pad = bs * attn1
        out = {}
        for i, kind in enumerate(m["layer_types"]):
            name = f"layers.{i}"
            if kind == "full_attention":
                out[name] = FullAttentionSpec(block_size=bs, num_kv_heads=heads, head_size=m["head_dim"], dtype=dt)
            elif kind == "sliding_attention":
                out[name] = SlidingWindowSpec(block_size=bs, num_kv_heads=heads, head_size=m["head_dim"], dtype=dt,
                                              sliding_window=m["window"])
            elif kind == "chunked_attention":
                out[name] = ChunkedLocalAttentionSpec(block_size=bs, num_kv_heads=heads, head_size=m["head_dim"], dtype=dt,
                                                      attention_chunk_size=m["window"])
            else:
                out[name] = MambaSpec(block_size=131072, shapes=shapes, dtypes=(mdt, DT[m["ssm"] or m["dtype_bytes"]]),
                                      page_size_padded=pad, mamba_type="gdn_attention", num_speculative_blocks=k)
        for i in range(draft_layers):  # the drafter's own attention layers: full attention, the target's shape
            out[f"drafter.layers.{i}"] = FullAttentionSpec(block_size=bs, num_kv_heads=heads, head_size=m["head_dim"],
                                                           dtype=dt)
        return out, bs, mamba_page

    models = json.load(open(models_path))
    rows = []
    for name, m in models.items():
        method, draft_layers, ks, managers = DRAFTERS[name] if drafters else (None, 0, (0,), (False, True))
        if drafters and name not in DRAFTERS:
            continue
        for tp in (1, 2):
            for disable in managers:
                for k in ks:
                    for mml, mnbt, is_async in ((131072, 8192, True), (32768, 2048, True), (32768, 2048, False)):
                        c = cfg(mml, mnbt, disable, is_async)
                        sp, bs, mamba_page = specs(m, tp, 16, draft_layers=draft_layers, k=k)
                        avail = 40 * GIB
                        row = dict(model=name, tp=tp, hybrid_manager=not disable, max_model_len=mml,
                                   max_num_batched_tokens=mnbt, async_scheduling=is_async, available_bytes=avail)
                        if drafters:
                            row.update(speculative_method=method, drafter_layers=draft_layers,
                                       num_speculative_tokens=k)
                        try:
                            groups = plan.get_kv_cache_groups(c, sp)
                            kcc = plan.get_kv_cache_config_from_groups(c, groups, avail)
                        except Exception as exc:
                            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
                            rows.append(row); continue
                        min_bs = min(g.kv_cache_spec.block_size for g in groups)
                        row.update(block_size=min_bs, mamba_page_bytes=mamba_page,
                                   groups=[[type(g.kv_cache_spec).__name__, len(g.layer_names)] for g in groups],
                                   page_bytes=groups[0].kv_cache_spec.page_size_bytes if len(groups) > 1 else None,
                                   num_blocks=kcc.num_blocks, kv_cache_tokens=kcc.num_blocks // len(groups) * min_bs,
                                   max_concurrency=round(get_conc(c, kcc), 6))
                        rows.append(row)
    json.dump({"vllm_version": __import__("vllm").__version__, "rows": rows}, open(out_path, "w"), indent=0)
    print(len(rows), "rows")


if __name__ == "__main__":
    args = build_parser().parse_args()
    run(args.release, args.models_path, args.out_path, args.drafters)
