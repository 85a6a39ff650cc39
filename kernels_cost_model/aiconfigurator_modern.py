"""Streaming readers for AIConfigurator's tables of modern model shapes: MLA, FP8 GEMMs, quantised MoE.

Same source, licence and rules as aiconfigurator_tables.py (read from ../shared/data/kernel_profiles,
never copied; Parquet read one record batch at a time). Rows are plain dicts for modern_fit.py:

- MLA (DeepSeek-V3's attention, vLLM's MLA backends): `mla_rows(root, system, phase)`, phase "context"
  (prefill of `isl` new tokens per sequence, empty cache) or "generation" (one token over `step` cached
  ones). vLLM 0.24 tables time the whole attention *module* (projections included, `gemm_type` bf16 or
  fp8_block); the a100 table (vLLM 0.14) times the attention kernel alone, at 128/tp heads.
- FP8 GEMMs: `gemm_rows(root, system, dtype)`, dtype "fp8" (per-tensor scales) or "fp8_block" (128x128
  block scales, DeepSeek style).
- MoE layers by weight dtype: `moe_rows(root, system, dtype)`, balanced routing only.
- Gated DeltaNet (Qwen3-Next's linear attention): `gdn_rows(root, system)`, one row per case with the
  causal conv1d and the gated delta rule kernels summed (prefill: chunked rule from an empty state;
  decode: the packed recurrent update).
Every row carries `source` (file and vLLM version). A malformed value raises MalformedTableError.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .aiconfigurator_tables import (ORIGIN, SYSTEMS, MalformedTableError, _latency_s, _number, _records,
                                    table_path)
from .errors import ConfigError

#: MLA tables: phase -> (file names tried in order: vLLM 0.24 module table, vLLM 0.14 kernel table).
MLA_FILES = {"context": ("mla_context_module_perf.parquet", "context_mla_perf.parquet"),
             "generation": ("mla_generation_module_perf.parquet", "generation_mla_perf.parquet")}
MLA_COLUMNS = ("version", "kernel_source", "kv_cache_dtype", "num_heads", "batch_size", "isl", "step", "latency")
GEMM_DTYPES = ("fp8", "fp8_block")
MOE_DTYPES = ("bfloat16", "fp8", "fp8_block", "w4a16_mxfp4")
#: Smallest weight width kept (as aiconfigurator_tables.MIN_MATMUL_WIDTH).
MIN_WIDTH = 512


def _check_system(system: str) -> None:
    if system not in SYSTEMS:
        raise ConfigError("system", system, f"unknown AIConfigurator system; known: {sorted(SYSTEMS)}")


def _source(root: Path, path: Path, version: object) -> str:
    return f"{ORIGIN}/{path.relative_to(Path(root) / 'aiconfigurator').as_posix()} (vLLM {version})"


def mla_path(root: str | Path, system: str, phase: str) -> Path | None:
    """The newest MLA table of this phase for a system, or None."""
    _check_system(system)
    if phase not in MLA_FILES:
        raise ConfigError("phase", phase, f"must be one of {sorted(MLA_FILES)}")
    base = Path(root) / "aiconfigurator" / system / "mla" / "vllm"
    for name in MLA_FILES[phase]:
        found = sorted(base.glob(f"*/{name}"), key=lambda p: tuple(int(x) for x in p.parent.name.split(".")
                                                                 if x.isdigit()))
        if found:
            return found[-1]
    return None


def mla_rows(root: str | Path, system: str, phase: str) -> Iterator[dict]:
    """MLA rows: heads (per GPU), batch, isl, step, kv_dtype, gemm ("bfloat16"/"fp8_block"), scope
    ("module": projections included; "kernel": attention only), kernel (the table's kernel_source),
    seconds, source."""
    path = mla_path(root, system, phase)
    if path is None:
        return
    module = "module" in path.name
    for raw in _records(path, MLA_COLUMNS + (("gemm_type",) if module else ())):
        kv = str(raw["kv_cache_dtype"])
        if kv not in ("bfloat16", "fp8"):
            raise MalformedTableError(f"{path}:kv_cache_dtype", kv, "must be bfloat16 or fp8")
        yield {"heads": _number(path, raw, "num_heads", 1), "batch": _number(path, raw, "batch_size", 1),
               "isl": _number(path, raw, "isl", 1), "step": _number(path, raw, "step"), "kv_dtype": kv,
               "gemm": str(raw["gemm_type"]) if module else "bfloat16",
               "scope": "module" if module else "kernel", "kernel": str(raw["kernel_source"]),
               "seconds": _latency_s(path, raw), "source": _source(Path(root), path, raw["version"])}


def gemm_rows(root: str | Path, system: str, dtype: str) -> Iterator[dict]:
    """GEMM rows of one weight dtype: m, n, k, seconds, kernel, source."""
    _check_system(system)
    if dtype not in GEMM_DTYPES + ("bfloat16",):
        raise ConfigError("gemm_dtype", dtype, f"must be one of {GEMM_DTYPES + ('bfloat16',)}")
    path = table_path(root, system, "gemm")
    if path is None:
        return
    for raw in _records(path, ("version", "gemm_dtype", "kernel_source", "m", "n", "k", "latency")):
        if raw["gemm_dtype"] != dtype:
            continue
        m, n, k = (_number(path, raw, c, 1) for c in ("m", "n", "k"))
        if min(n, k) < MIN_WIDTH:
            continue
        yield {"m": m, "n": n, "k": k, "seconds": _latency_s(path, raw), "kernel": str(raw["kernel_source"]),
               "source": _source(Path(root), path, raw["version"])}


def moe_rows(root: str | Path, system: str, dtype: str) -> Iterator[dict]:
    """Balanced-routing FusedMoE rows of one weight dtype, as this GPU sees them: tokens, hidden,
    inter (per expert, after the TP split), experts (on this GPU), top_k (per token on this GPU)."""
    _check_system(system)
    if dtype not in MOE_DTYPES:
        raise ConfigError("moe_dtype", dtype, f"must be one of {MOE_DTYPES}")
    path = table_path(root, system, "moe")
    if path is None:
        return
    cols = ("version", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
            "moe_tp_size", "moe_ep_size", "distribution", "latency")
    for raw in _records(path, cols):
        if raw["moe_dtype"] != dtype or raw["distribution"] != "balanced":
            continue
        tp, ep = _number(path, raw, "moe_tp_size", 1), _number(path, raw, "moe_ep_size", 1)
        yield {"tokens": _number(path, raw, "num_tokens", 1), "hidden": _number(path, raw, "hidden_size", 1),
               "inter": _number(path, raw, "inter_size", 1) / tp,
               "experts": _number(path, raw, "num_experts", 1) / ep, "top_k": _number(path, raw, "topk", 1) / ep,
               "seconds": _latency_s(path, raw), "source": _source(Path(root), path, raw["version"])}


GDN_COLUMNS = ("version", "kernel_source", "phase", "batch_size", "seq_len", "num_k_heads", "head_k_dim",
               "num_v_heads", "head_v_dim", "d_model", "latency")


def gdn_rows(root: str | Path, system: str) -> list[dict]:
    """GDN layer cases: phase, batch, seq_len, k_heads, k_dim, v_heads, v_dim, seconds (both kernels), source."""
    _check_system(system)
    base = Path(root) / "aiconfigurator" / system / "linear_attention" / "vllm"
    found = sorted(base.glob("*/gdn_perf.parquet"))
    if not found:
        return []
    path, cases = found[-1], {}
    for raw in _records(path, GDN_COLUMNS):
        phase = str(raw["phase"])
        if phase not in ("context", "generation"):
            raise MalformedTableError(f"{path}:phase", phase, "must be context or generation")
        key = (phase, *(_number(path, raw, c, 1) for c in ("batch_size", "seq_len", "num_k_heads", "head_k_dim",
                                                            "num_v_heads", "head_v_dim", "d_model")))
        case = cases.setdefault(key, {"seconds": 0.0, "kernels": set(), "version": raw["version"]})
        case["seconds"] += _latency_s(path, raw)
        case["kernels"].add(str(raw["kernel_source"]))
    return [{"phase": k[0], "batch": k[1], "seq_len": k[2], "k_heads": k[3], "k_dim": k[4], "v_heads": k[5],
             "v_dim": k[6], "seconds": c["seconds"], "source": _source(Path(root), path, c["version"])}
            for k, c in sorted(cases.items()) if len(c["kernels"]) == 2]  # a case missing a kernel is dropped
