"""Measured kernel times from LLMServingSim's vLLM 0.19 profiler (RTX 4090, RTX PRO 6000), as profile rows.

casys-kaist/LLMServingSim `profiler/perf/<hardware>/<org>/<model>/bf16/tp<N>/{dense,attention}.csv` (MIT),
read in place from the shared data folder (never copied): per-layer kernel times at token counts
1-2048 and attention times for pure-decode and pure-prefill launches. Layer names map onto this
project's operators with the model's shapes on one GPU (`tp`). Mixed launches (decodes beside a chunk)
are priced by `attention_backend.py`.
"""
from __future__ import annotations

import csv
from pathlib import Path

from .models import ModelSpec, get_model
from .profile_schema import validate_row

LICENCE = ("measurements: casys-kaist/LLMServingSim profiler/perf (vLLM 0.19, bf16), "
           "MIT licence (c) casys-kaist; see data/LICENSE-llmservingsim-MIT.txt")
#: Layers no fit reads: Qwen3's per-head q/k norms (priced at the RMSNorm operator's rates over head rows and
#: checked against these rows, tests/test_qk_norm.py), the sampler (priced in the LM head).
SKIPPED_LAYERS = ("qk_norm", "q_norm", "k_norm", "sampler")


def _dense_shape(layer: str, spec: ModelSpec, tp: int, t: int) -> tuple[str, int, int, int] | None:
    """(our operator, m, n, k) for one dense.csv layer of `spec` on one of `tp` GPUs."""
    h, hd = spec.hidden_size, spec.head_dim
    heads, kv = spec.num_heads // tp, max(spec.num_kv_heads // tp, 1)
    inter = spec.intermediate_size // tp
    shapes = {
        "qkv_proj": ("qkv_proj", t, (heads + 2 * kv) * hd, h),
        "o_proj": ("o_proj", t, h, heads * hd),
        "gate_up_proj": ("mlp_up", t, 2 * inter, h),
        "down_proj": ("mlp_down", t, h, inter),
        "lm_head": ("lm_head", t, spec.vocab_size // tp, h),
        "act_fn": ("silu_mul", t, inter, 0),
        "layernorm": ("rms_norm", t, h, 0),
        "final_layernorm": ("add_rms_norm", t, h, 0),  # vLLM's model.norm(hidden, residual): fused add
        "rotary_emb": ("rope", t, (heads + kv) * hd, 0),
        "embedding": ("embedding", t, h, 0),
    }
    if spec.is_moe and layer in ("gate_up_proj", "down_proj", "act_fn"):
        return None  # the MoE model's MLP is its experts (moe.csv), not a dense layer
    return shapes.get(layer)


def _attention_row(raw: dict, spec: ModelSpec, tp: int) -> dict | None:
    """Pure-decode or pure-prefill launch; mixed launches are left to attention_backend.py."""
    n_dec, chunk = int(float(raw["n_decode"] or 0)), int(float(raw["prefill_chunk"] or 0))
    if n_dec and chunk:
        return None
    heads, kv = spec.num_heads // tp, max(spec.num_kv_heads // tp, 1)
    row = {"num_heads": heads, "num_kv_heads": kv, "head_dim": spec.head_dim}
    # LLMServingSim's shot puts each request in as (new tokens, history): `kv_prefill` and `kv_decode` are the
    # tokens already cached (vLLM's num_computed_tokens), so a row attends to history + its own new tokens
    # (profiler/core/hooks/batch.py, Shot.attention, at the commit these files come from; kernel_profiles README)
    if n_dec:
        return {**row, "operator": "decode_attention", "batch": n_dec, "context": int(float(raw["kv_decode"]))}
    return {**row, "operator": "prefill_attention", "batch": 1, "chunk": chunk,
            "context": int(float(raw["kv_prefill"]))}


def _rows_of(raw: dict, origin: str, line: int, device: str) -> list[dict]:
    spec, tp = get_model(raw["model"]), int(raw["tp"])
    kernel = raw["kernel"].strip()
    if kernel in SKIPPED_LAYERS or kernel.startswith("moe:"):
        return []
    if kernel == "attention":
        row = _attention_row(raw, spec, tp)
    else:
        shape = _dense_shape(kernel, spec, tp, int(float(raw["tokens"])))
        row = None if shape is None else dict(zip(("operator", "m", "n", "k"), shape))
    if row is None:
        return []
    row.update({"tp": tp, "dtype": "bfloat16", "measured_s": float(raw["time_us"]) * 1e-6, "device": device,
                "source": f'{raw["source"]} [{kernel}]'})
    return [validate_row(row, origin, line)]


#: LLMServingSim hardware folder -> our GPU catalog name.
HARDWARE = {"RTXPRO6000": "rtx-pro-6000", "RTX4090": "rtx-4090"}
SHARED_COMMIT = "5daddb21"


def read_shared_profiles(root: str | Path, hardware: str) -> list[dict]:
    """Profile rows read in place from `llmservingsim/<hardware>/<org>/<model>/bf16/tp<N>/{dense,attention}.csv`
    under root (../shared/data/kernel_profiles): the files are streamed, never copied."""
    base = Path(root) / "llmservingsim" / hardware
    files = sorted(base.glob("*/*/bf16/tp*/dense.csv")) + sorted(base.glob("*/*/bf16/tp*/attention.csv"))
    rows: list[dict] = []
    for path in files:
        org, model, _, tp_dir = path.relative_to(base).parts[:4]
        rel = path.relative_to(Path(root) / "llmservingsim").as_posix()
        context = {"model": f"{org}/{model}", "tp": tp_dir[2:],
                   "source": f"casys-kaist/LLMServingSim@{SHARED_COMMIT} profiler/perf/{rel} (vLLM 0.19.0)"}
        with path.open(newline="") as fh:
            for line, raw in enumerate(csv.DictReader(fh), start=2):
                if path.name == "attention.csv":
                    raw = {"kernel": "attention", **raw}
                else:
                    raw = {"kernel": raw["layer"], **raw}
                rows.extend(_rows_of({**raw, **context}, rel, line, HARDWARE[hardware]))
    return rows


MIXED_COLUMNS = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")


def read_mixed_launches(root: str | Path, hardware: str):
    """Measured mixed launches (one chunk of `chunk` tokens over `kv_prefill` cached ones beside `n_decode`
    decodes of `kv_decode` cached ones each), streamed from every `attention.csv` under
    `llmservingsim/<hardware>/` as dicts (model, tp, chunk, kv_prefill, n_decode, kv_decode, measured_s).
    A malformed table raises MalformedTableError naming the file, line and column."""
    from .aiconfigurator_tables import MalformedTableError
    base = Path(root) / "llmservingsim" / hardware
    for path in sorted(base.glob("*/*/bf16/tp*/attention.csv")):
        org, model, _, tp_dir = path.relative_to(base).parts[:4]
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in MIXED_COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise MalformedTableError(f"{path}:columns", reader.fieldnames, f"lacks columns {missing}")
            for line, raw in enumerate(reader, start=2):
                try:
                    chunk, kp, n, kd = (int(float(raw[c])) for c in MIXED_COLUMNS[:4])
                    t = float(raw["time_us"]) * 1e-6
                except (TypeError, ValueError):
                    raise MalformedTableError(f"{path}:{line}", [raw.get(c) for c in MIXED_COLUMNS],
                                              "must be numbers") from None
                if chunk and n:
                    yield {"model": f"{org}/{model}", "tp": int(tp_dir[2:]), "chunk": chunk, "kv_prefill": kp,
                           "n_decode": n, "kv_decode": kd, "measured_s": t}
