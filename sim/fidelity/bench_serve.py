"""A `vllm bench serve --save-result --save-detailed` JSON file as a measured run (`calibrate --from-run`).

The file holds per-request lists in request order: `input_lens`, `output_lens`, `ttfts`, `itls` (the gaps
between a request's streamed chunks), `start_times` (when the client sent each request), `errors` (""
for a success), and in some vLLM releases `latencies` or `e2els` (its end-to-end time); all in seconds.
It has no token ids and no engine arguments, so:

- arrivals are the `start_times`, from the first one on; TTFT is `ttfts`; E2E is `e2els` or `latencies`
  where written, else TTFT plus the sum of `itls`; TPOT = (E2E - TTFT) / (outputs - 1), as vLLM defines it;
- prompts get token ids of their own per request (no two share a first block, so no prefix-cache hits:
  right for ShareGPT-like prompts, wrong for prompts that share a system prompt) and each request
  emits exactly its `output_lens` tokens (vLLM's benchmark sends `ignore_eos`);
- failed requests (an error, no TTFT, no output) are left out of the replay and the scoring, with a
  warning naming how many;
- the engine arguments and the GPU come from the caller (`servesim calibrate --from-run FILE --model ...
  --gpu ... --tp ...`).

The latencies are the client's, over HTTP: the fitted engine time per request also absorbs what the API
server and the client add (sim/api/client.py), so the deployment it writes describes that client too.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from kernels_cost_model.errors import ConfigError, is_number, require, require_path
from sim.core.sampling_params import SamplingParams
from workloads.spec import RequestSpec

from .real_runs import RealRun, blocks_from_meta, check_meta, measured_table

#: Per-request lists a detailed result must hold.
REQUIRED_LISTS = ("input_lens", "output_lens", "ttfts", "start_times")
#: Where a prompt's token ids start; each request's ids run on from its own offset (mod ID_SPAN).
ID_BASE, ID_SPAN = 1000, 1 << 30


def read_bench_serve(path: str | Path, engine_kwargs: dict, gpu: str, vllm_version: str = "") -> RealRun:
    """The measured run in a detailed `vllm bench serve` result file, served with `engine_kwargs`
    (vLLM's names: model, tensor_parallel_size, max_num_seqs, max_num_batched_tokens, ...) on `gpu`."""
    path = require_path("--from-run", path, "a vllm bench serve result file")
    doc = _load(path)
    lists = _lists(doc, path)
    ok = _successes(doc, lists, path)
    meta = check_meta({"model": engine_kwargs.get("model"), "gpu": gpu, "vllm_version": vllm_version,
                       "engine_kwargs": dict(engine_kwargs), "source": f"vllm bench serve: {path}"}, path)
    measured = _measured(doc, lists, ok, path)
    specs = [_spec(i, int(lists["input_lens"][i]), int(lists["output_lens"][i]), a)
             for i, a in zip(np.flatnonzero(ok), measured["arrival_s"])]
    return RealRun(path.stem, path, meta, sorted(specs, key=lambda s: s.arrival_time_s), measured,
                   pd.DataFrame({"t": []}), float(np.min(np.asarray(lists["start_times"], dtype=float))),
                   blocks_from_meta(meta))


def _load(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("--from-run", str(path), "file not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("--from-run", str(path), f"not a JSON file ({exc})") from None
    require(isinstance(doc, dict), "--from-run", str(path), "must hold a JSON object (vllm bench serve's result)")
    return doc


def _lists(doc: dict, path: Path) -> dict:
    missing = [k for k in REQUIRED_LISTS if not isinstance(doc.get(k), list)]
    require(not missing, f"{path}:{missing[0] if missing else ''}", doc.get(missing[0]) if missing else None,
            "missing: write the result with `vllm bench serve --save-result --save-detailed` (start_times "
            "need a vLLM release that writes them)")
    n = len(doc["input_lens"])
    require(n > 0, f"{path}:input_lens", n, "no requests")
    for key in (*REQUIRED_LISTS, "itls", "latencies", "e2els"):
        if isinstance(doc.get(key), list):
            require(len(doc[key]) == n, f"{path}:{key}", len(doc[key]), f"must list every request ({n})")
    for key in ("input_lens", "output_lens", "start_times"):
        bad = next((i for i, v in enumerate(doc[key]) if not is_number(v) or v < 0), None)
        require(bad is None, f"{path}:{key}[{bad}]", None if bad is None else doc[key][bad],
                "must be a number >= 0")
    return doc


def _successes(doc: dict, lists: dict, path: Path) -> np.ndarray:
    """Requests that completed: no error, a TTFT, at least one output token."""
    n = len(lists["input_lens"])
    errors = doc.get("errors") if isinstance(doc.get("errors"), list) and len(doc["errors"]) == n else [""] * n
    ok = np.array([not err and is_number(t) and t > 0 and out >= 1
                   for err, t, out in zip(errors, lists["ttfts"], lists["output_lens"])], dtype=bool)
    require(ok.any(), f"{path}:ttfts", None, "no request completed (each has an error, no TTFT or no output): "
            "nothing to fit")
    if not ok.all():
        warnings.warn(f"{path}: {int((~ok).sum())} of {n} requests failed or have no TTFT; they are left "
                      "out of the replay and the fit", stacklevel=3)
    return ok


def _measured(doc: dict, lists: dict, ok: np.ndarray, path: Path) -> pd.DataFrame:
    """The completed requests' latencies as the shared runs' table (real_runs.measured_table), from
    their send time, TTFT and end-to-end time."""
    idx = np.flatnonzero(ok)
    start = np.asarray(lists["start_times"], dtype=float)[idx]
    ttft = np.array([lists["ttfts"][i] for i in idx], dtype=float)
    return measured_table(pd.DataFrame({
        "request_id": [f"bench-{i}" for i in idx], "input_toks": np.asarray(lists["input_lens"], dtype=int)[idx],
        "output_toks": np.asarray(lists["output_lens"], dtype=int)[idx], "queued_ts": start, "scheduled_ts": np.nan,
        "first_token_ts": start + ttft, "last_token_ts": start + _e2e(doc, idx, ttft, path)}))


def _e2e(doc: dict, idx: np.ndarray, ttft: np.ndarray, path: Path) -> np.ndarray:
    """Completed requests' end-to-end times: as written, or TTFT plus their streamed gaps."""
    for key in ("e2els", "latencies"):
        if isinstance(doc.get(key), list):
            values = [doc[key][i] for i in idx]
            bad = next((j for j, v in enumerate(values) if not is_number(v) or v < ttft[j]), None)
            require(bad is None, f"{path}:{key}[{idx[bad] if bad is not None else ''}]",
                    None if bad is None else values[bad], "must be a number >= the request's TTFT")
            return np.array(values, dtype=float)
    require(isinstance(doc.get("itls"), list), f"{path}:itls", doc.get("itls"),
            "missing, and no latencies or e2els either")
    gaps = [doc["itls"][i] for i in idx]
    bad = next((j for j, g in enumerate(gaps) if not isinstance(g, list) or not all(is_number(x) and x >= 0 for x in g)),
               None)
    require(bad is None, f"{path}:itls[{idx[bad] if bad is not None else ''}]", None if bad is None else gaps[bad],
            "must be a list of gaps >= 0 (s)")
    return ttft + np.array([sum(g) for g in gaps], dtype=float)


def _spec(index: int, prompt: int, output: int, arrival: float) -> RequestSpec:
    """Request `index`: `prompt` token ids of its own, exactly `output` outputs (ignore_eos)."""
    ids = ID_BASE + (index * 7919 * 1009 + np.arange(max(prompt, 1), dtype=np.int64)) % ID_SPAN
    return RequestSpec(arrival_time_s=float(arrival), prompt_token_ids=ids.astype(np.int32), output_len=None,
                       request_id=f"bench-{index}",
                       sampling_params=SamplingParams(max_tokens=output, min_tokens=output, ignore_eos=True))
