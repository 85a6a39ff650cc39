"""Read Vidur's published per-layer profiles (MIT, microsoft/vidur) into this project's profile rows.

The files are never copied: pass the folder that holds them (e.g. ../shared/data/kernel_profiles).
Vidur reports milliseconds per operator per layer for a model shape at a token count and TP degree.
"""
from __future__ import annotations

import csv
from pathlib import Path

from kernels_cost_model.errors import ConfigError

from .profile_schema import validate_row

#: Vidur device folder -> our GPU catalog name (Vidur's A100 runs are 80 GB SXM; H100 are DGX/SXM).
DEVICE_NAMES = {"a100": "a100-sxm-80gb", "h100": "h100-sxm"}
NETWORK_SETUPS = {"a100_dgx": "a100-sxm-80gb", "h100_dgx": "h100-sxm"}


def _mlp_rows(raw: dict, device: str, source: str) -> list[dict]:
    h, heads, kv = int(raw["n_embd"]), int(raw["n_head"]), int(raw["n_kv_head"])
    inter, tp, t = int(raw["n_expanded_embd"]), int(raw["num_tensor_parallel_workers"]), int(raw["num_tokens"])
    hd = h // heads
    gated = str(raw["use_gated_mlp"]).lower() == "true"
    shapes = {  # vidur column -> (our operator, m, n, k)
        "attn_pre_proj": ("qkv_proj", t, (heads + 2 * kv) * hd // tp, h),
        "attn_post_proj": ("o_proj", t, h, heads * hd // tp),
        "mlp_up_proj": ("mlp_up", t, (2 if gated else 1) * inter // tp, h),
        "mlp_down_proj": ("mlp_down", t, h, inter // tp),
        "input_layernorm": ("rms_norm", t, h, 0),
        "post_attention_layernorm": ("rms_norm", t, h, 0),
        "mlp_act": ("silu_mul", t, inter // tp, 0),
        "attn_rope": ("rope", t, (heads + kv) * hd // tp, 0),
        "add": ("add", t, h, 0),
        "emb": ("embedding", t, h, 0),
    }
    rows = []
    for column, (op, m, n, k) in shapes.items():
        ms = raw.get(f"time_stats.{column}.median")
        if ms in (None, ""):
            continue
        rows.append(validate_row({"operator": op, "m": m, "n": n, "k": k or "", "tp": tp, "dtype": "float16",
                                  "measured_s": float(ms) / 1e3, "device": device,
                                  "source": f"{source} [{column}]"}, source))
    return rows


def read_vidur_compute(root: str | Path) -> list[dict]:
    """All `compute/<gpu>/<org>/<model>/mlp.csv` under root, as profile rows."""
    root = Path(root)
    files = sorted(root.glob("compute/*/*/*/mlp.csv"))
    if not files:
        raise ConfigError("profile_dir", str(root), "no compute/<gpu>/<org>/<model>/mlp.csv files found")
    rows: list[dict] = []
    for path in files:
        gpu_dir = path.relative_to(root).parts[1]
        device = DEVICE_NAMES.get(gpu_dir, gpu_dir)
        source = f"vidur@7d47513:data/profiling/{path.relative_to(root).as_posix()}"
        with path.open(newline="") as fh:
            for raw in csv.DictReader(fh):
                rows.extend(_mlp_rows(raw, device, source))
    return rows


def read_vidur_network(root: str | Path) -> list[dict]:
    """Single-node all-reduce times (`network/<gpu>_dgx/all_reduce.csv`); `size` is bytes."""
    root = Path(root)
    rows: list[dict] = []
    for setup, device in NETWORK_SETUPS.items():
        path = root / "network" / setup / "all_reduce.csv"
        if not path.is_file():
            continue
        source = f"vidur@7d47513:data/profiling/network/{setup}/all_reduce.csv"
        with path.open(newline="") as fh:
            for raw in csv.DictReader(fh):
                if raw["num_workers"] != raw["devices_per_node"]:
                    continue  # keep the all-NVLink, single-node groups that tensor parallelism uses
                rows.append(validate_row({"operator": "all_reduce", "size_bytes": raw["size"],
                                          "tp": raw["num_workers"], "dtype": "float16",
                                          "measured_s": float(raw["time_stats.all_reduce.median"]) / 1e3,
                                          "device": device, "source": source}, source))
    return rows
