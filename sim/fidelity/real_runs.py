"""Reader of real vLLM benchmark runs (`../shared/data/real_vllm_runs/`, see its README).

A run folder holds `meta.json` (engine arguments), `requests.jsonl` (per-request timestamps) and
`timeseries.csv` (running/waiting per second); its workload is a JSONL file in `../workloads/` with
the real token ids. Clocks (from the data's README): `queued_ts`/`scheduled_ts` are the engine's
monotonic clock, `first_token_ts`/`last_token_ts` the frontend's; both are the host's monotonic
clock, so TTFT = first_token_ts - queued_ts, E2E = last_token_ts - queued_ts and
TPOT = (last_token_ts - first_token_ts) / (output_toks - 1).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kernels_cost_model.errors import ConfigError, require, require_path
from sim.core.sampling_params import SamplingParams
from workloads.spec import RequestSpec

#: Where the runs live, relative to the repository root (never copied into the repo).
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "real_vllm_runs"

#: The workload file each model's run replays (the README: the Qwen file serves both Qwen runs).
WORKLOAD_FILES = {"llama": "sharegpt-llama-3.1-8b-300-sps10.jsonl",
                  "qwen": "sharegpt-qwen3-32b-300-sps10.jsonl"}

#: Settings the README gives for every shared run (vLLM 0.19 defaults where not passed explicitly); a
#: run of your own overrides each in `meta.json`'s `engine_kwargs` (the GPU as `meta["gpu"]`). The
#: entry point (`usage_context`) picks vLLM's defaults for an unset max_num_seqs / max_num_batched_tokens.
RUN_DEFAULTS = dict(block_size=16, enable_chunked_prefill=True, enable_prefix_caching=True,
                    gpu_memory_utilization=0.9, gpu="rtx-pro-6000", usage_context="openai_api_server")
#: Per-request fields of requests.jsonl.
REQUEST_COLUMNS = ("request_id", "input_toks", "output_toks", "arrival_time", "queued_ts", "scheduled_ts",
                   "first_token_ts", "last_token_ts")
#: engine_kwargs every run must give (an unset max_num_seqs or max_num_batched_tokens takes vLLM's default).
REQUIRED_ENGINE_KWARGS = ("model", "tensor_parallel_size")


@dataclass(frozen=True)
class RealRun:
    """One measured run: its engine arguments, workload and measurements."""

    name: str
    path: Path
    meta: dict
    workload: list          # RequestSpec, sorted by arrival, arrival in workload time (s from 0)
    measured: pd.DataFrame  # per request: request_id, arrival_s, ttft_s, tpot_s, e2e_s, ...
    timeseries: pd.DataFrame
    first_arrival_wall_s: float = 0.0
    #: num_gpu_blocks the run records (meta, or vLLM's start-up log in its folder); None where it records none
    recorded_blocks: int | None = None

    @property
    def engine_kwargs(self) -> dict:
        return self.meta["engine_kwargs"]

    @property
    def gpu(self) -> str:
        """The catalog GPU the run was measured on (`meta["gpu"]`; the shared runs: RTX PRO 6000)."""
        return self.meta.get("gpu") or RUN_DEFAULTS["gpu"]

    def setting(self, name: str):
        """An engine setting of RUN_DEFAULTS: the run's own where `engine_kwargs` gives it."""
        value = self.engine_kwargs.get(name)
        return RUN_DEFAULTS[name] if value is None else value

    def tick_times(self) -> np.ndarray:
        """The timeseries' ticks on the replay clock (0 = first request queued): `t` counts from
        `started_at`, which precedes the first request's wall-clock arrival."""
        started = pd.Timestamp(self.meta["started_at"]).timestamp()
        return self.timeseries["t"].to_numpy(float) - (self.first_arrival_wall_s - started)

    @property
    def data_parallel_size(self) -> int:
        return int(self.engine_kwargs.get("data_parallel_size") or 1)


def find_runs(root: str | Path = DEFAULT_ROOT) -> list[Path]:
    """Run folders under `root` (empty when the data is absent)."""
    root = Path(root)
    return sorted(p.parent for p in root.glob("*/*/meta.json")) if root.is_dir() else []


def workload_file(run_dir: Path, meta: dict) -> Path:
    """The workload the run replayed: `meta["dataset_path"]` in the run folder or two folders up (the
    shared runs' layout), else the shared runs' file for the model (the README: the Qwen file serves
    both Qwen runs, whose MoE `dataset_path` names a file that is not there)."""
    given = meta.get("dataset_path")
    tried = [base / given for base in (run_dir, run_dir.parent.parent)] if isinstance(given, str) and given else []
    key = "llama" if "llama" in meta["model"].lower() else "qwen"
    tried.append(run_dir.parent.parent / "workloads" / WORKLOAD_FILES[key])
    found = next((p for p in tried if p.is_file()), None)
    require(found is not None, f"{run_dir / 'meta.json'}:dataset_path", given,
            f"no workload file found (looked for {', '.join(str(p) for p in tried)})")
    return found


def read_workload(path: str | Path) -> list[RequestSpec]:
    """RequestSpecs with the real prompt ids and exactly `output_toks` outputs (ignore_eos)."""
    path, specs = require_path("workload", path, "a workload JSONL file"), []
    for i, (_, row) in enumerate(_jsonl_objects(path, ("output_toks", "arrival_time_ns", "input_tok_ids"))):
        n = int(row["output_toks"])
        specs.append(RequestSpec(
            arrival_time_s=row["arrival_time_ns"] * 1e-9,
            prompt_token_ids=np.asarray(row["input_tok_ids"], dtype=np.int32),
            output_len=None, request_id=f"bench-{i}",
            sampling_params=SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True)))
    return sorted(specs, key=lambda s: s.arrival_time_s)


def measured_table(rows) -> pd.DataFrame:
    """Per-request measured latencies from `requests.jsonl` rows, or a DataFrame of their columns
    (times relative to first queue)."""
    df = pd.DataFrame(rows)
    t0 = df["queued_ts"].min()
    out = pd.DataFrame({"request_id": df["request_id"], "num_prompt_tokens": df["input_toks"],
                        "num_output_tokens": df["output_toks"]})
    out["arrival_s"] = df["queued_ts"] - t0
    out["scheduled_s"] = df["scheduled_ts"] - t0
    out["first_token_s"] = df["first_token_ts"] - t0
    out["finish_s"] = df["last_token_ts"] - t0
    out["ttft_s"] = df["first_token_ts"] - df["queued_ts"]
    out["e2e_s"] = df["last_token_ts"] - df["queued_ts"]
    decode = (df["output_toks"] - 1).where(df["output_toks"] > 1)
    out["tpot_s"] = (df["last_token_ts"] - df["first_token_ts"]) / decode
    return out


def read_run(run_dir: str | Path) -> RealRun:
    """Load one run folder and its workload."""
    run_dir = require_path("run_dir", run_dir, "a run folder")
    require((run_dir / "meta.json").is_file(), "run_dir", str(run_dir), "has no meta.json: not a run folder in the"
            " shared runs' format (meta.json, requests.jsonl, timeseries.csv)")
    meta = check_meta(_json(run_dir / "meta.json"), run_dir / "meta.json")
    rows = [row for _, row in _jsonl_objects(run_dir / "requests.jsonl")]
    require(bool(rows), str(run_dir / "requests.jsonl"), 0, "no requests")
    missing = sorted(set(REQUEST_COLUMNS) - set().union(*map(set, rows)))
    require(not missing, str(run_dir / "requests.jsonl"), ", ".join(missing), "missing (the shared runs' format)")
    block_size = meta["engine_kwargs"].get("block_size") or RUN_DEFAULTS["block_size"]
    return RealRun(run_dir.name, run_dir, meta, read_workload(workload_file(run_dir, meta)),
                   measured_table(rows), pd.read_csv(run_dir / "timeseries.csv"),
                   min(r["arrival_time"] for r in rows), recorded_gpu_blocks(run_dir, block_size))


def _json(path: Path):
    try:
        return json.loads(_text(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), f"line {exc.lineno}", f"not JSON: {exc.msg}") from None


def _text(path: Path) -> str:
    """A file's text; one that is not UTF-8 is a ConfigError naming it."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), f"byte {exc.start}", "not UTF-8 text") from None


def _jsonl_objects(path: Path, keys: tuple[str, ...] = ()):
    """(line number, object) of each non-blank line of a JSONL file; a line that is not a JSON object, or
    lacks one of `keys`, is a ConfigError naming the file and the line."""
    for number, line in enumerate(_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(str(path), f"line {number}", f"not JSON: {exc.msg}") from None
        require(isinstance(row, dict), str(path), f"line {number}", "must be a JSON object")
        missing = [key for key in keys if key not in row]
        require(not missing, str(path), f"line {number}", f"lacks {missing} (the shared runs' format)")
        yield number, row


def check_meta(meta, path) -> dict:
    """`meta` if it names the model and the engine arguments a replay needs; else a named error."""
    require(isinstance(meta, dict) and isinstance(meta.get("engine_kwargs"), dict), str(path), type(meta).__name__,
            "must be a JSON object with an `engine_kwargs` object")
    kw = meta["engine_kwargs"]
    missing = [k for k in REQUIRED_ENGINE_KWARGS if kw.get(k) is None]
    require(not missing, f"{path}:engine_kwargs", missing, "missing (vLLM's engine arguments of the run)")
    require(isinstance(meta.get("model", kw["model"]), str), f"{path}:model", meta.get("model"), "must be a string")
    meta.setdefault("model", kw["model"])
    return meta


_TOKENS = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")
_BLOCKS = re.compile(r"(?:# GPU blocks:|num_gpu_blocks\s*[=:])\s*([\d,]+)")


def blocks_from_log(text: str, block_size: int) -> int | None:
    """num_gpu_blocks from vLLM start-up log text (the last statement wins), or None."""
    blocks = [int(m.replace(",", "")) for m in _BLOCKS.findall(text)]
    if blocks:
        return blocks[-1]
    tokens = [int(m.replace(",", "")) for m in _TOKENS.findall(text)]
    return tokens[-1] // block_size if tokens else None


def blocks_from_meta(meta: dict) -> int | None:
    for where in (meta, meta.get("engine_kwargs") or {}, meta.get("cache_config") or {}):
        for key in ("num_gpu_blocks", "num_gpu_blocks_override"):
            if where.get(key) is not None:
                return int(where[key])
    return None


def recorded_gpu_blocks(run_dir: str | Path, block_size: int = RUN_DEFAULTS["block_size"]) -> int | None:
    """The num_gpu_blocks a run folder records (meta.json, then logs), or None."""
    run_dir = Path(run_dir)
    meta_path = run_dir / "meta.json"
    if meta_path.is_file() and (found := blocks_from_meta(json.loads(meta_path.read_text()))) is not None:
        return found
    for path in sorted(run_dir.glob("*.log")) + sorted(run_dir.glob("*.txt")):
        if (found := blocks_from_log(path.read_text(errors="replace"), block_size)) is not None:
            return found
    return None
