"""KV block copies between GPU memory and pinned host memory: what a CPU KV tier's loads and stores take.

vLLM 0.19's offloading connector (`--kv-offloading-size`, the native backend) moves a transfer's blocks
with `swap_blocks`: one cudaMemcpyAsync per block and KV tensor. With one KV layer group the cache is laid
out across layers (`prefer_cross_layer_blocks`), so each block is one copy of all its layers' K and V on
that GPU. A transfer's copies run one after another on the copy engine of their direction, and each
direction's transfers run one after another (a stream per transfer, each waiting for the one before).

vLLM 0.33 copies each layer's page of a block apart and issues a transfer's copies in one
cuMemcpyBatchAsync call (`host_copies(link, "0.33")`; the caller counts the copies).

`HostCopies.seconds(copies, copy_bytes, direction)` prices that from servesim's own measurement
(`data/measured/h200-host-copies.csv`, benchmarks/measure_host_copies.py: an H200 on PCIe Gen5 x16,
copy-engine time per copy by size, interpolated between the measured sizes). On a link without a
measurement each copy costs the link's latency plus its bytes at the link's bandwidth.
"""
from __future__ import annotations

import bisect
import csv
from dataclasses import dataclass
from functools import lru_cache

from kernels_cost_model.errors import ConfigError, require
from kernels_cost_model.gpu_calibration import MEASURED_DIR
from kernels_cost_model.links import Link, get_link

DIRECTIONS = ("h2d", "d2h")
MEASURED = {"pcie5": "h200-host-copies.csv"}
"""Links with a measured curve, and its file under data/measured (the host's link, from its env.json)."""
METHODS = {"0.19": "per_block", "0.33": "batch"}
"""The measured method each vLLM release's offloading worker matches: 0.19's `swap_blocks` issues
separate copies, one per block; 0.33's `swap_blocks_batch` issues a transfer's copies in one
cuMemcpyBatchAsync call (its Triton path for small host-to-device pages is not measured)."""


@dataclass(frozen=True)
class CopyCurve:
    """Copy-engine seconds per copy at measured copy sizes (ascending), for one direction."""

    sizes: tuple[int, ...]
    per_copy_s: tuple[float, ...]

    def seconds(self, copy_bytes: float) -> float:
        """One copy of `copy_bytes`: linear between measured sizes, the smallest's time below them (a
        copy's fixed cost), the last segment's slope above."""
        sizes, times = self.sizes, self.per_copy_s
        if copy_bytes <= sizes[0]:
            return times[0]
        i = min(max(bisect.bisect_left(sizes, copy_bytes), 1), len(sizes) - 1)
        slope = (times[i] - times[i - 1]) / (sizes[i] - sizes[i - 1])
        return times[i - 1] + slope * (copy_bytes - sizes[i - 1])


@dataclass(frozen=True)
class HostCopies:
    """Prices a transfer of `copies` copies of `copy_bytes` each, host to device ("h2d") or back ("d2h")."""

    link: Link
    curves: dict | None = None   # direction -> CopyCurve, where the link has a measurement
    source: str = ""

    def seconds(self, copies: int, copy_bytes: float, direction: str) -> float:
        require(direction in DIRECTIONS, "direction", direction, f"must be one of {DIRECTIONS}")
        if copies <= 0 or copy_bytes <= 0:
            return 0.0
        if self.curves is None:
            return copies * self.link.transfer_time_s(copy_bytes)
        return copies * self.curves[direction].seconds(copy_bytes)


def host_copies(link: str | Link, release: str = "0.19") -> HostCopies:
    """The pricing of block copies over `link` (by name or alias) as vLLM `release` ("0.19", "0.33")
    issues them: measured where servesim has a curve."""
    link = get_link(link)
    require(release in METHODS, "release", release, f"must be one of {sorted(METHODS)}")
    if link.name not in MEASURED:
        return HostCopies(link, None, link.source)
    curves, source = _measured(MEASURED[link.name], METHODS[release])
    return HostCopies(link, curves, source)


@lru_cache(maxsize=None)
def _measured(filename: str, method: str = "per_block") -> tuple[dict, str]:
    """The rows of one measured file for `method`, as a curve per direction."""
    rows: dict[str, list[tuple[int, float]]] = {d: [] for d in DIRECTIONS}
    path = MEASURED_DIR / filename
    with path.open(newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            if row.get("method") != method:
                continue
            rows[_direction(row, path, line)].append(_point(row, path, line))
    for direction, points in rows.items():
        if len(points) < 2:
            raise ConfigError(f"{path.name} {method} {direction} rows", len(points), "need at least two copy sizes")
    curves = {d: CopyCurve(tuple(s for s, _ in sorted(p)), tuple(t for _, t in sorted(p))) for d, p in rows.items()}
    return curves, f"servesim measurement {path.name} ({method} copies; device and date in its env.json)"


def _direction(row: dict, path, line: int) -> str:
    direction = row.get("direction")
    if direction not in DIRECTIONS:
        raise ConfigError(f"{path.name} line {line} direction", direction, f"must be one of {DIRECTIONS}")
    return direction


def _point(row: dict, path, line: int) -> tuple[int, float]:
    """(copy bytes, seconds per copy) of one row; a malformed row is a named error."""
    try:
        size, copies, seconds = int(row["copy_bytes"]), int(row["copies"]), float(row["seconds"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{path.name} line {line}", row, "needs integer copy_bytes and copies and a "
                          "number of seconds") from None
    if size <= 0 or copies <= 0 or not 0 < seconds < 3600:
        raise ConfigError(f"{path.name} line {line}", row, "copy_bytes and copies must be > 0 and seconds "
                          "in (0, 3600)")
    return size, seconds / copies
