"""Synthetic open-loop workloads: an arrival process plus a (prompt, output) length sampler.

    poisson_workload(rate=10, num_requests=1000, lengths="sharegpt")

Benchmark-style by default: `SamplingParams(max_tokens=output_len, ignore_eos=True)`, so each
request runs exactly its sampled output length.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kernels_cost_model.errors import require
from sim.core.fields import MAX_NUM_REQUESTS, check_types
from sim.core.sampling_params import SamplingParams
from workloads.arrivals import Gamma, Poisson, arrival_times
from workloads.presets import resolve_lengths
from workloads.spec import RequestSpec
from workloads.tokens import hashed_tokens, random_prompts

SYSTEM_PROMPT_SALT = 7
CHUNK = 1024  # requests whose prompt ids are drawn in one call


@dataclass(frozen=True, slots=True)
class SyntheticWorkload:
    """`num_requests` requests (or all within `duration_s`) with lengths from `lengths`.

    lengths: a preset name ("sharegpt", "arxiv", "sharegpt:lognormal", ...) or a pair sampler.
    max_tokens: the requests' cap; None means each request's own output length.
    shared_prefix_len: the first tokens every prompt shares (a system prompt), for prefix caching.
    """

    arrivals: object
    lengths: object = "sharegpt"
    num_requests: int | None = None
    duration_s: float | None = None
    max_tokens: int | None = None
    ignore_eos: bool = True
    priority: int = 0
    tenant: str = "default"
    shared_prefix_len: int = 0

    def __post_init__(self) -> None:
        check_types(self)
        require((self.num_requests is None) != (self.duration_s is None), "num_requests/duration_s",
                (self.num_requests, self.duration_s), "give exactly one")
        require(self.num_requests is None or 0 <= self.num_requests <= MAX_NUM_REQUESTS, "num_requests",
                self.num_requests, f"must be in [0, {MAX_NUM_REQUESTS}]")
        require(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", self.max_tokens,
                "must be >= 1 or None")
        require(self.shared_prefix_len >= 0, "shared_prefix_len", self.shared_prefix_len, "must be >= 0")
        require(hasattr(self.arrivals, "sample"), "arrivals", self.arrivals,
                "must be an arrival process with .sample(rng, n)")
        resolve_lengths(self.lengths)  # fails fast on an unknown preset name or a lone distribution

    def iter_requests(self, rng: np.random.Generator) -> Iterator[RequestSpec]:
        """Arrival-sorted specs "req-0", "req-1", ...; the same rng state gives the same specs."""
        arrival_rng, length_rng, token_rng = rng.spawn(3)
        times = arrival_times(self.arrivals, arrival_rng, self.num_requests, self.duration_s)
        prompt_lens, output_lens = resolve_lengths(self.lengths).sample(length_rng, times.size)
        params = _ParamsCache(self.max_tokens, self.ignore_eos)
        for start in range(0, times.size, CHUNK):
            stop = start + CHUNK
            prompts = self._prompts(token_rng, prompt_lens[start:stop])
            rows = zip(times[start:stop].tolist(), prompts, output_lens[start:stop].tolist())
            for i, (t, prompt, o) in enumerate(rows, start):
                yield RequestSpec(arrival_time_s=t, prompt_token_ids=prompt, output_len=o,
                                  sampling_params=params.get(o), request_id=f"req-{i}",
                                  priority=self.priority, tenant=self.tenant)

    def _prompts(self, rng: np.random.Generator, lengths: np.ndarray) -> list[np.ndarray]:
        k = self.shared_prefix_len
        if k == 0:
            return random_prompts(rng, lengths)
        k = min(k, int(lengths.max(initial=0)))  # no prompt uses more: memory follows the prompts
        prefix = hashed_tokens(np.arange(k), SYSTEM_PROMPT_SALT)
        tails = random_prompts(rng, np.maximum(lengths - k, 0))
        return [np.concatenate([prefix[:n], tail]) for n, tail in zip(lengths.tolist(), tails)]


class _ParamsCache:
    """One SamplingParams per distinct max_tokens (they are immutable, so requests share them)."""

    def __init__(self, max_tokens: int | None, ignore_eos: bool):
        self.max_tokens, self.ignore_eos, self.cache = max_tokens, ignore_eos, {}

    def get(self, output_len: int) -> SamplingParams:
        cap = self.max_tokens or output_len
        if cap not in self.cache:
            self.cache[cap] = SamplingParams(max_tokens=cap, ignore_eos=self.ignore_eos)
        return self.cache[cap]


def poisson_workload(rate: float, num_requests: int | None = None, lengths="sharegpt",
                     **kwargs) -> SyntheticWorkload:
    """Poisson arrivals at `rate` req/s; e.g. poisson_workload(10, 1000, "sharegpt")."""
    return SyntheticWorkload(Poisson(rate), lengths, num_requests, **kwargs)


def gamma_workload(rate: float, cv: float, num_requests: int | None = None, lengths="sharegpt",
                   **kwargs) -> SyntheticWorkload:
    """Gamma arrivals at `rate` req/s with inter-arrival CV `cv` (burstiness)."""
    return SyntheticWorkload(Gamma(rate, cv), lengths, num_requests, **kwargs)
