"""TraceWorkload: replay a trace file as RequestSpecs, streaming, with optional time scaling.

Benchmark replay by default: output_len = the trace's generated tokens with
SamplingParams(max_tokens=that, ignore_eos=True). Prompt ids: Mooncake-style hash ids map to fixed
token blocks (equal ids, equal prefixes); a generic `prefix_id` maps to a fixed shared prefix;
everything else is random from the rng.
"""
from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from kernels_cost_model.errors import require, require_path
from sim.core.fields import check_types
from sim.core.sampling_params import SamplingParams
from workloads.errors import TraceFormatError
from workloads.spec import RequestSpec
from workloads.tokens import block_tokens, hashed_tokens, random_tokens
from workloads.traces import READERS, TraceRow, read_trace

ZERO_OUTPUT = ("skip", "error", "one")
PREFIX_SALT = 11


@dataclass(frozen=True, slots=True)
class TraceWorkload:
    """Requests read from `path` (format: azure | mooncake | burstgpt | generic | None = infer).

    target_rate: rescale time so that N / span equals it (two streaming passes over the file).
    time_scale: multiply all arrival times by this (e.g. 0.5 = twice as fast); not with target_rate.
    max_requests: stop after this many requests.
    zero_output: rows with 0 generated tokens: "skip" (default; failed requests), "error", "one".
    ignore_eos / max_tokens: the sampling params (max_tokens None = the trace's output tokens).
    """

    path: str | Path
    format: str | None = None
    target_rate: float | None = None
    time_scale: float | None = None
    max_requests: int | None = None
    zero_output: str = "skip"
    ignore_eos: bool = True
    max_tokens: int | None = None
    tenant: str = "default"

    def __post_init__(self) -> None:
        require_path("path", self.path, "a trace file")
        check_types(self)
        require(self.format is None or self.format in READERS, "format", self.format,
                f"must be one of {sorted(READERS)} or None")
        require(self.target_rate is None or self.target_rate > 0, "target_rate", self.target_rate, "must be > 0")
        require(self.time_scale is None or self.time_scale > 0, "time_scale", self.time_scale, "must be > 0")
        require(self.target_rate is None or self.time_scale is None, "time_scale", self.time_scale,
                "give target_rate or time_scale, not both")
        require(self.max_requests is None or self.max_requests >= 1, "max_requests", self.max_requests,
                "must be >= 1 or None")
        require(self.zero_output in ZERO_OUTPUT, "zero_output", self.zero_output, f"must be one of {ZERO_OUTPUT}")
        require(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", self.max_tokens, "must be >= 1")

    def rows(self) -> Iterator[TraceRow]:
        """The trace rows this workload replays (zero-output policy and max_requests applied)."""
        return islice(self._filtered(), self.max_requests)

    def _filtered(self, skipped_lines: list[int] | None = None) -> Iterator[TraceRow]:
        """The rows under the zero-output policy; the lines of rows skipped are appended to `skipped_lines`."""
        kept = skipped = 0
        for row in read_trace(self.path, self.format):
            if row.output_len == 0:
                if self.zero_output == "skip":
                    skipped += 1
                    if skipped_lines is not None:
                        skipped_lines.append(row.line)
                    continue
                if self.zero_output == "error":
                    raise TraceFormatError(self.path, row.line, "0 generated tokens (zero_output='error')")
                row = row._replace(output_len=1)
            kept += 1
            yield row
        if kept == 0:
            raise TraceFormatError(self.path, 1, f"no requests left: all {skipped} row(s) have 0 generated tokens "
                                                 "(failed requests) and were skipped")

    def scale(self) -> float:
        """The factor applied to trace times (a streaming pass when target_rate is set)."""
        if self.target_rate is None:
            return self.time_scale or 1.0
        n, first, last = 0, None, 0.0
        for row in self.rows():
            n, first, last = n + 1, row.arrival_s if first is None else first, row.arrival_s
        span = last - (first or 0.0)
        if n == 1:
            return 1.0
        require(span > 0, "target_rate", self.target_rate, f"the trace's {n} arrivals span 0 s; cannot rescale "
                                                           "them to a rate")
        return (n / span) / self.target_rate

    def iter_requests(self, rng: np.random.Generator) -> Iterator[RequestSpec]:
        """Arrival-sorted specs "req-0", ...; times rebased so the first request arrives at 0. Rows skipped
        for 0 generated tokens are counted in a warning once the rows are read."""
        scale, params, start, skipped = self.scale(), {}, None, []
        for i, row in enumerate(islice(self._filtered(skipped), self.max_requests)):
            start = row.arrival_s if start is None else start
            cap = self.max_tokens or row.output_len
            if cap not in params:
                params[cap] = SamplingParams(max_tokens=cap, ignore_eos=self.ignore_eos)
            yield RequestSpec(arrival_time_s=max(0.0, (row.arrival_s - start) * scale),
                              prompt_token_ids=prompt_ids(row, rng), output_len=row.output_len,
                              sampling_params=params[cap], request_id=f"req-{i}", priority=row.priority,
                              tenant=row.tenant or self.tenant, session_id=row.session_id)
        if skipped:
            warn_skipped(self.path, skipped)


def warn_skipped(path, lines: list[int]) -> None:
    """Say how many trace rows were left out for having 0 generated tokens, and where."""
    shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
    warnings.warn(f"{path}: {len(lines)} row(s) with 0 generated tokens (failed requests) were skipped "
                  f"(line {shown}); from Python, TraceWorkload(zero_output='one') replays them as 1-token requests",
                  UserWarning, stacklevel=2)


def prompt_ids(row: TraceRow, rng: np.random.Generator) -> np.ndarray:
    """Token ids for a trace row: hash-id blocks, a shared prefix + random tail, or random."""
    if row.hash_ids is not None:
        return block_tokens(row.hash_ids, row.prompt_len, row.block_size)
    if row.prefix_id is None or row.prefix_len == 0:
        return random_tokens(rng, row.prompt_len)
    k = min(row.prefix_len, row.prompt_len)
    key = np.uint64(int.from_bytes(hashlib.blake2b(row.prefix_id.encode(), digest_size=5).digest(), "little"))
    prefix = hashed_tokens(np.arange(k, dtype=np.uint64) + (key << np.uint64(20)), PREFIX_SALT)
    return np.concatenate([prefix, random_tokens(rng, row.prompt_len - k)])
