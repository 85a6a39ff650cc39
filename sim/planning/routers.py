"""Routers: pick the replica a request goes to.

A router sees the replicas (each an `EngineProcess`) and the request spec; `choose(spec)` returns an
index. Ties go to the lowest index, so routing is deterministic.

- round_robin: 0, 1, 2, ... regardless of load.
- least_outstanding: fewest requests submitted and not yet finished (llm-d / SGLang router default).
- least_kv: lowest KV-cache occupancy (used blocks / blocks), then fewest outstanding.
- prefix_affinity: a session's turns go where its first turn went (that replica caches its prefix);
  a request without a session sticks by the hash of its first prompt block; new keys go to the
  least-outstanding replica.
"""
from __future__ import annotations

import hashlib

from kernels_cost_model.errors import require

ROUTERS = ("round_robin", "least_outstanding", "least_kv", "prefix_affinity")


class Router:
    """Base: holds the replicas and the count of outstanding requests per replica."""

    def __init__(self, replicas: list):
        self.replicas = replicas
        self.outstanding = [0] * len(replicas)

    def choose(self, spec) -> int:
        raise NotImplementedError

    def least_outstanding(self) -> int:
        return min(range(len(self.replicas)), key=lambda i: (self.outstanding[i], i))


class RoundRobin(Router):
    def __init__(self, replicas: list):
        super().__init__(replicas)
        self.next = 0

    def choose(self, spec) -> int:
        i, self.next = self.next, (self.next + 1) % len(self.replicas)
        return i


class LeastOutstanding(Router):
    def choose(self, spec) -> int:
        return self.least_outstanding()


class LeastKVLoad(Router):
    def choose(self, spec) -> int:
        def load(i: int) -> tuple:
            kv = self.replicas[i].engine.state.kv
            return kv.num_used_blocks / kv.num_gpu_blocks, self.outstanding[i], i
        return min(range(len(self.replicas)), key=load)


class PrefixAffinity(Router):
    def __init__(self, replicas: list, block_size: int = 16):
        super().__init__(replicas)
        self.block_size = block_size
        self.home: dict[str, int] = {}

    def choose(self, spec) -> int:
        key = spec.session_id or _prefix_key(spec.prompt_token_ids[: self.block_size])
        if key not in self.home:
            self.home[key] = self.least_outstanding()
        return self.home[key]


def _prefix_key(ids) -> str:
    return "prefix:" + hashlib.sha256(ids.tobytes()).hexdigest()[:16]


def make_router(name: str, replicas: list, block_size: int = 16) -> Router:
    """The router called `name` over `replicas`."""
    require(name in ROUTERS, "router", name, f"must be one of {ROUTERS}")
    if name == "prefix_affinity":
        return PrefixAffinity(replicas, block_size)
    return {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding,
            "least_kv": LeastKVLoad}[name](replicas)
