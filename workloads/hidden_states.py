"""Requests that ask for the final token's hidden state (`RequestSpec.return_hidden_states`).

    with_hidden_states(poisson_workload(10, 1000), fraction=0.3)

Each request asks with probability `fraction`, drawn from a stream of its own derived from the
workload's generator without drawing from it: the wrapped workload's requests are otherwise
exactly the unwrapped ones (fraction 0 gives the same specs), and a request that asks at one
fraction also asks at any larger one (same seed).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np

from kernels_cost_model.errors import require
from sim.core.fields import is_number
from workloads.base import is_closed_loop
from workloads.spec import RequestSpec

#: Spawn-key word of the picks' stream (ASCII "HSID"; beyond any child index a workload spawns).
PICKS_STREAM = 0x48534944


def picks_rng(rng: np.random.Generator) -> np.random.Generator:
    """An independent generator derived from `rng`'s seed sequence; `rng` is left untouched."""
    seq = rng.bit_generator.seed_seq
    require(isinstance(seq, np.random.SeedSequence), "rng", rng, "must be seeded by a SeedSequence")
    return np.random.default_rng(np.random.SeedSequence(seq.entropy, spawn_key=(*seq.spawn_key, PICKS_STREAM),
                                                        pool_size=seq.pool_size))


def _mark(spec: RequestSpec, picks: np.random.Generator, fraction: float) -> RequestSpec:
    if picks.random() < fraction and not spec.return_hidden_states:
        return dataclasses.replace(spec, return_hidden_states=True)
    return spec


@dataclasses.dataclass(frozen=True)
class _OpenLoop:
    workload: object
    fraction: float

    def iter_requests(self, rng: np.random.Generator) -> Iterator[RequestSpec]:
        picks = picks_rng(rng)
        inner = self.workload.iter_requests(rng) if hasattr(self.workload, "iter_requests") else self.workload
        for spec in inner:
            yield _mark(spec, picks, self.fraction)


@dataclasses.dataclass(frozen=True)
class _ClosedLoop:
    workload: object
    fraction: float

    def process(self, env, submit, rng: np.random.Generator):
        picks = picks_rng(rng)
        return self.workload.process(env, lambda spec: submit(_mark(spec, picks, self.fraction)), rng)


def with_hidden_states(workload, fraction: float):
    """`workload` (open-loop, closed-loop, or a list of specs) with a `fraction` of its requests
    asking for hidden states."""
    require(is_number(fraction) and 0.0 <= fraction <= 1.0, "fraction", fraction, "must be in [0, 1]")
    if is_closed_loop(workload):
        return _ClosedLoop(workload, fraction)
    if not hasattr(workload, "iter_requests"):
        require(isinstance(workload, Iterable) and not isinstance(workload, (str, bytes)), "workload", workload,
                "must be a workload object or a list of RequestSpec")
        workload = tuple(workload)
    return _OpenLoop(workload, fraction)
