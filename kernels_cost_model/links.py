"""Links that move KV caches between GPUs or between GPU and host: NVLink, PCIe, InfiniBand, RoCE.

Figures live in `data/links.csv` (one cited source per row): one-way bandwidth per GPU port and a
one-way latency. A transfer of `num_bytes` over `lanes` ports in parallel (one per tensor-parallel
rank) takes `latency + num_bytes / (lanes x bandwidth)`; contention between transfers is the
caller's business (sim.planning.transfer queues them).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from kernels_cost_model.errors import require

from ._catalog import alias_index, lookup, read_catalog
from .kv_layout import LINEAR, linear_state_bytes
from .kv_memory import kv_bytes_per_token, kv_layout
from .models import get_model


@dataclass(frozen=True, slots=True)
class Link:
    """One port's one-way bandwidth (bytes/s) and latency (s)."""

    name: str
    bytes_per_s: float
    latency_s: float
    source: str = ""

    def __post_init__(self) -> None:
        require(self.bytes_per_s > 0, "link.bytes_per_s", self.bytes_per_s, "must be > 0")
        require(self.latency_s >= 0, "link.latency_s", self.latency_s, "must be >= 0")

    def transfer_time_s(self, num_bytes: float, lanes: int = 1) -> float:
        """Seconds to move `num_bytes` split evenly over `lanes` ports (0 bytes cost nothing)."""
        if num_bytes <= 0:
            return 0.0
        return self.latency_s + num_bytes / (lanes * self.bytes_per_s)


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, Link], dict[str, str]]:
    rows = read_catalog("links.csv")
    links = {r["name"]: Link(r["name"], float(r["bytes_per_s"]), float(r["latency_s"]), r["source"])
             for r in rows}
    return links, alias_index(rows)


def list_links() -> list[str]:
    return sorted(_catalog()[0])


def get_link(name: str | Link) -> Link:
    """A link by name or alias ("nvlink", "pcie5", "infiniband", "roce"), case-insensitively."""
    if isinstance(name, Link):
        return name
    return lookup(*_catalog(), name, "link", "link")


def kv_transfer_bytes(model, num_tokens: int, kv_cache_dtype: str = "auto") -> int:
    """Bytes of KV cache for `num_tokens` tokens of `model`, all layers and KV heads (every rank), as the
    cache stores them (`kv_cache_dtype`: fp8 moves one byte a value)."""
    return kv_bytes_per_token(model, 1, kv_cache_dtype) * max(0, num_tokens)


def hybrid_kv_transfer_bytes(model, block_size: int, num_tokens: int, num_cached_tokens: int = 0,
                             kv_cache_dtype: str = "auto") -> int:
    """Bytes vLLM 0.33's NIXL connector moves for one request of `model` whose hybrid KV manager stays
    on (every rank): per group the blocks `KVCacheLayout.transfer_blocks` counts, each read in every
    layer slot of a pool block (group_size pages, a padded group's too: nixl/base_worker.py
    `_compute_desc_ids`), a state block as each slot's conv and SSM state (`_build_mamba_local`); pages
    as the cache stores them (`kv_cache_dtype`)."""
    spec = get_model(model)
    layout = kv_layout(spec, 1, block_size, kv_cache_dtype)
    state = linear_state_bytes(spec, 1) if any(g.kind == LINEAR for g in layout.groups) else 0
    blocks = layout.transfer_blocks(num_tokens, num_cached_tokens)
    return layout.group_size * sum(n * (state if g.kind == LINEAR else layout.page_bytes)
                                   for g, n in zip(layout.groups, blocks))
