"""Streaming readers for NVIDIA AIConfigurator's vLLM kernel tables (Apache-2.0), as profile rows.

The tables are never copied: pass the folder that holds `aiconfigurator/` (../shared/data/kernel_profiles).
Each Parquet file is read in record batches (pyarrow), one GPU's one family at a time. Rows become this
project's profile rows (profile_schema.py) for the shapes the simulator prices: bf16 GEMMs, full
(unwindowed) bf16-KV attention at head_dim 64/128, vLLM's all-reduce as it serves (captured in a CUDA
graph; eager on a GPU whose platform serves without graphs, cuda_graph.EAGER_ARCHITECTURES), and
bf16 MoE layers with balanced routing. A table whose columns, units or values are not what the
collector writes raises `MalformedTableError`, naming the file, column and value.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .cuda_graph import EAGER_ARCHITECTURES
from .errors import ConfigError
from .hardware import get_gpu
from .profile_schema import validate_row

#: AIConfigurator system folder -> our GPU catalog name (hardware.py).
SYSTEMS = {
    "a100_sxm": "a100-sxm-80gb", "h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200",
    "b300_sxm": "b300", "gb200": "gb200", "gb300": "gb300", "l40s": "l40s",
    "rtx_pro_6000_server": "rtx-pro-6000", "b60": "arc-pro-b60",
}
ORIGIN = "ai-dynamo/aiconfigurator@095f58a5 aic-core/src/aiconfigurator_core/systems/data"
LICENCE = ("measurements: ai-dynamo/aiconfigurator vLLM tables @095f58a5, Apache-2.0 (c) NVIDIA; "
           "see data/LICENSE-aiconfigurator-Apache-2.0.txt")
#: Head sizes of the catalog models; other head sizes run other kernels (FA4 at 512) and are skipped.
HEAD_DIMS = (64, 128)
#: Matmul widths below this are not weight matmuls of any catalog model at TP <= 8.
MIN_MATMUL_WIDTH = 512
#: Families and their table: (subfolder, file, columns every row must have).
TABLES = {
    "gemm": ("gemm", "gemm_perf.parquet", ("version", "gemm_dtype", "m", "n", "k", "latency")),
    "context_attention": ("attention", "context_attention_perf.parquet",
                          ("version", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
                           "kv_cache_dtype", "latency")),
    "generation_attention": ("attention", "generation_attention_perf.parquet",
                             ("version", "batch_size", "step", "num_heads", "num_key_value_heads", "head_dim",
                              "kv_cache_dtype", "latency")),
    "all_reduce": ("comm", "custom_allreduce_perf.parquet",
                   ("version", "num_gpus", "message_size", "kernel_source", "latency")),
    "moe": ("moe", "moe_perf.parquet", ("version", "moe_dtype", "num_tokens", "hidden_size", "inter_size",
                                        "topk", "num_experts", "moe_tp_size", "moe_ep_size", "distribution",
                                        "latency")),
}
#: L2 cache per GPU (bytes) and its source. AIConfigurator's decode-attention collector replays one layer
#: over one KV cache (CUDA-graph replays, no copies cycled as for GEMMs), so a launch whose K and V fit in
#: L2 reads them from L2; serving streams every layer's weights between two launches of a layer and reads
#: KV from DRAM. Rows in the first state become `decode_attention_l2` (roofline.py). The held-out errors
#: show the cliff at these sizes (docs/cost_model.md). GPUs without a documented figure are not split.
L2_BYTES = {
    "a100_sxm": (40 * 2**20, "NVIDIA A100 Tensor Core GPU Architecture whitepaper: 40 MB L2"),
    "h100_sxm": (50 * 2**20, "NVIDIA H100 Tensor Core GPU Architecture whitepaper: 50 MB L2 (SXM5)"),
    "h200_sxm": (50 * 2**20, "same GH100 die as H100 SXM5 (NVIDIA H200 datasheet: H100 with HBM3e)"),
    "l40s": (96 * 2**20, "NVIDIA L40S product brief: 96 MB L2 (AD102)"),
    "rtx_pro_6000_server": (128 * 2**20, "casys-kaist/LLMServingSim profiler/perf/RTXPRO6000/hardware.yaml "
                                         "spec.l2_cache_mib = 128.0 (read from the device)"),
    "b200_sxm": (int(126.5 * 2**20), "cudaDeviceProp on an NVIDIA B200: 'L2 Cache Size: 126.50 MB' (pytorch/ao PR "
                                     "#4002, read from the device); chipsandcheese.com 'Nvidia's B200' measures "
                                     "126 MB; NVIDIA's Blackwell Tuning Guide, 'Increased L2 Capacity'"),
    "gb200": (int(126.5 * 2**20), "the B200 GPU (GB200 = Grace + two B200 GPUs): as b200_sxm"),
    "b300_sxm": (int(126.5 * 2**20), "no NVIDIA figure found; taken as B200's. AIConfigurator's unsplit decode fit "
                                     "shows the same cliff as on B200 (held-out residual +20 % at 64 MiB of K + V, "
                                     "-8 % at 128 MiB; docs/cost_model.md)"),
    "gb300": (int(126.5 * 2**20), "the B300 GPU: as b300_sxm"),
    "b60": (18 * 2**20, "TechPowerUp, 'Intel Arc B580 Battlemage unboxing & preview' p.2: the BMG-G21 die has an 18 MB "
                        "L2; the Arc Pro B60 is that die with all 20 Xe2 cores (Intel's product page: 20 Xe cores, "
                        "160 XMX engines)"),
}
#: Columns read where a table has them (a100's attention tables predate sliding windows).
OPTIONAL_COLUMNS = ("window_size",)
BATCH_ROWS = 16384


class MalformedTableError(ConfigError):
    """A kernel table that is not in the layout the AIConfigurator collector writes."""


def table_path(root: str | Path, system: str, kind: str) -> Path | None:
    """The newest vLLM version folder's table of this kind for a system, or None when absent."""
    sub, name, _ = TABLES[kind]
    backend = "vllm"
    base = Path(root) / "aiconfigurator" / system / sub / backend
    found = sorted(base.glob(f"*/{name}"), key=lambda p: tuple(int(x) for x in p.parent.name.split(".")
                                                             if x.isdigit()))
    return found[-1] if found else None


def _records(path: Path, columns: tuple[str, ...]) -> Iterator[dict]:
    """Rows of a Parquet table as dicts, one record batch at a time; checks the schema first."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # optional dependency (pyproject extra "parquet")
        raise ConfigError("pyarrow", None, "reading AIConfigurator tables needs pyarrow "
                          "(pip install 'servesim[parquet]')") from exc
    try:
        handle = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise MalformedTableError(str(path), None, f"not a readable Parquet file: {exc}") from exc
    missing = [c for c in columns if c not in handle.schema_arrow.names]
    if missing:
        raise MalformedTableError(f"{path}:columns", handle.schema_arrow.names, f"lacks columns {missing}")
    wanted = [*columns, *(c for c in OPTIONAL_COLUMNS if c in handle.schema_arrow.names)]
    for batch in handle.iter_batches(batch_size=BATCH_ROWS, columns=wanted):
        yield from batch.to_pylist()


def _number(path: Path, row: dict, column: str, minimum: float = 0.0) -> float:
    value = row.get(column)
    if not isinstance(value, (int, float)) or value != value or value < minimum:
        raise MalformedTableError(f"{path}:{column}", value, f"must be a number >= {minimum}")
    return float(value)


def _latency_s(path: Path, row: dict) -> float:
    """`latency` is milliseconds in every table; one call can take neither 0 nor over a minute."""
    ms = _number(path, row, "latency")
    if not 0.0 < ms < 6e4:
        raise MalformedTableError(f"{path}:latency", ms, "must be a time in ms in (0, 60000)")
    return ms * 1e-3


def _source(path: Path, root: Path, version: str) -> str:
    return f"{ORIGIN}/{path.relative_to(Path(root) / 'aiconfigurator').as_posix()} (vLLM {version})"


def read_table(root: str | Path, system: str, kind: str) -> Iterator[dict]:
    """Profile rows of one table (see module docstring for the shapes kept); nothing if absent."""
    path = table_path(root, system, kind)
    if path is None:
        return
    device = SYSTEMS[system]
    convert = {"gemm": _gemm, "context_attention": _attention, "generation_attention": _attention,
               "all_reduce": _all_reduce, "moe": _moe}[kind]
    for raw in _records(path, TABLES[kind][2]):
        row = convert(path, raw, kind, system)
        if row is not None:
            row.update(device=device, source=_source(path, Path(root), str(raw["version"])))
            yield validate_row(row, str(path))


def _gemm(path: Path, raw: dict, kind: str, system: str) -> dict | None:
    m, n, k = (_number(path, raw, c, 1) for c in ("m", "n", "k"))
    if raw["gemm_dtype"] not in ("bfloat16", "float16") or min(n, k) < MIN_MATMUL_WIDTH:
        return None
    return {"operator": "matmul", "m": m, "n": n, "k": k, "dtype": "bfloat16", "measured_s": _latency_s(path, raw)}


def _attention(path: Path, raw: dict, kind: str, system: str) -> dict | None:
    heads, kv, hd = (_number(path, raw, c) for c in ("num_heads", "num_key_value_heads", "head_dim"))
    batch = _number(path, raw, "batch_size", 1)
    if raw["kv_cache_dtype"] != "bfloat16" or hd not in HEAD_DIMS or raw.get("window_size", 0):
        return None
    if heads < 1:
        raise MalformedTableError(f"{path}:num_heads", heads, "must be >= 1")
    kv = kv or heads  # the loader's convention: 0 KV heads means MHA
    row = {"batch": batch, "num_heads": heads, "num_kv_heads": kv, "head_dim": hd, "dtype": "bfloat16",
           "measured_s": _latency_s(path, raw)}
    if kind == "generation_attention":  # one new token over `step` cached ones
        context = _number(path, raw, "step")
        return {**row, "operator": _decode_operator(system, batch, context, kv, hd), "context": context}
    chunk = _number(path, raw, "isl", 1)
    return {**row, "operator": _prefill_operator(system, batch, chunk, heads, kv, hd), "chunk": chunk, "context": 0}


def kv_bytes(batch: float, context: float, kv_heads: float, head_dim: float) -> float:
    """Bytes of K and V (bf16) one decode launch reads: `context` cached keys plus the new one."""
    return 2.0 * 2.0 * batch * (context + 1.0) * kv_heads * head_dim


def _decode_operator(system: str, batch: float, context: float, kv: float, hd: float) -> str:
    l2 = L2_BYTES.get(system)
    return "decode_attention_l2" if l2 and kv_bytes(batch, context, kv, hd) <= l2[0] else "decode_attention"


def prefill_bytes(batch: float, chunk: float, heads: float, kv_heads: float, head_dim: float) -> float:
    """Bytes (bf16) of a prefill launch from an empty cache: Q and O of every query head, K and V."""
    return 2.0 * batch * chunk * (2.0 * heads + 2.0 * kv_heads) * head_dim


def _prefill_operator(system: str, batch: float, chunk: float, heads: float, kv: float, hd: float) -> str:
    """`prefill_attention_l2` for a chunk whose Q, K, V and O fit in L2 (the collector replays one layer on
    the same tensors, so they stay there), else `prefill_attention`; single-token rows run as decodes."""
    l2 = L2_BYTES.get(system)
    small = l2 and chunk > 1 and prefill_bytes(batch, chunk, heads, kv, hd) <= l2[0]
    return "prefill_attention_l2" if small else "prefill_attention"


def _all_reduce(path: Path, raw: dict, kind: str, system: str) -> dict | None:
    eager = get_gpu(SYSTEMS[system]).architecture in EAGER_ARCHITECTURES  # (b60: its table has eager rows only)
    if raw["kernel_source"] != ("vLLM_custom_eager" if eager else "vLLM_custom_graph"):
        return None  # (vLLM serves from CUDA graphs elsewhere; the eager rows time a path it does not take)
    ranks = _number(path, raw, "num_gpus", 2)
    return {"operator": "all_reduce", "tp": ranks, "size_bytes": 2.0 * _number(path, raw, "message_size", 1),
            "dtype": "bfloat16", "measured_s": _latency_s(path, raw)}


def _moe(path: Path, raw: dict, kind: str, system: str) -> dict | None:
    if raw["moe_dtype"] != "bfloat16" or raw["distribution"] != "balanced":
        return None
    # this GPU holds experts/ep experts, each split tp ways; balanced routing sends it topk/ep rows a token
    tp, ep = _number(path, raw, "moe_tp_size", 1), _number(path, raw, "moe_ep_size", 1)
    return {"operator": "moe", "m": _number(path, raw, "num_tokens", 1), "n": _number(path, raw, "hidden_size", 1),
            "k": _number(path, raw, "inter_size", 1) / tp, "num_experts": _number(path, raw, "num_experts", 1) / ep,
            "top_k": _number(path, raw, "topk", 1) / ep, "dtype": "bfloat16", "routing": "balanced",
            "measured_s": _latency_s(path, raw)}


def read_system(root: str | Path, system: str) -> list[dict]:
    """Every kept row of one system's tables."""
    if system not in SYSTEMS:
        raise ConfigError("system", system, f"unknown AIConfigurator system; known: {sorted(SYSTEMS)}")
    return [row for kind in TABLES for row in read_table(root, system, kind)]


#: nccl-tests' table (`comm/nccl/<version>/nccl_perf.parquet`): columns every row must have.
NCCL_COLUMNS = ("version", "op_name", "nccl_dtype", "num_gpus", "message_size", "latency")


def read_nccl(root: str | Path, system: str, collective: str = "all_reduce") -> Iterator[dict]:
    """nccl-tests rows of one system's newest NCCL folder for `collective` in half precision, as
    {ranks, size_bytes, measured_s, source}; nothing if absent. `message_size` is an element count
    (2 bytes each for half), `latency` the out-of-place time in ms."""
    base = Path(root) / "aiconfigurator" / system / "comm" / "nccl"
    found = sorted(base.glob("*/nccl_perf.parquet"),
                   key=lambda p: tuple(int(x) for x in p.parent.name.split(".") if x.isdigit()))
    if not found:
        return
    path = found[-1]
    for raw in _records(path, NCCL_COLUMNS):
        if raw["op_name"] != collective or raw["nccl_dtype"] != "half":
            continue
        yield {"ranks": _number(path, raw, "num_gpus", 2), "size_bytes": 2.0 * _number(path, raw, "message_size", 1),
               "measured_s": _latency_s(path, raw),
               "source": f"{ORIGIN}/{path.relative_to(Path(root) / 'aiconfigurator').as_posix()} "
                         f"(NCCL {raw['version']})"}
