"""GPU catalog: peak dense FLOP/s, memory bandwidth and size, interconnect; one cited source per row.

Figures are dense (never the 2:4-sparsity doubled numbers vendors headline) and live in
`data/gpus.csv`; this module only reads and validates them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from kernels_cost_model.errors import require

from ._catalog import alias_index, lookup, read_catalog


@dataclass(frozen=True, slots=True)
class GPU:
    """One accelerator's datasheet figures (SI units: FLOP/s, bytes/s, bytes)."""

    name: str
    bf16_flops_per_s: float
    fp8_flops_per_s: float | None
    hbm_bytes_per_s: float
    memory_bytes: int
    interconnect_bytes_per_s: float
    interconnect: str = ""
    source: str = ""
    #: Architecture generation (ampere, ada, hopper, blackwell, cdna3): sets the derived default
    #: efficiencies of a GPU with no calibration (derived_defaults.py).
    architecture: str = ""
    #: CUDA compute capability ("9.0", "10.3"; blank for other vendors), as NVIDIA's CUDA GPUs list
    #: (developer.nvidia.com/cuda-gpus) gives it: within an architecture it tells parts with other
    #: hardware apart, e.g. Blackwell Ultra (10.3: B300, GB300) from Blackwell (10.0: B200, GB200).
    compute_capability: str = ""
    #: DRAM technology as the datasheet names it (HBM3, GDDR6X, ...; blank where unknown): the derived
    #: default of elementwise kernels follows it (`memory_family`, derived_defaults.py).
    memory_type: str = ""

    @property
    def memory_family(self) -> str:
        """The memory's family, "hbm" or "gddr" (from `memory_type`); "" where the catalog does not say."""
        kind = self.memory_type.lower()
        return next((family for family in ("hbm", "gddr") if kind.startswith(family)), "")

    @property
    def has_nvlink(self) -> bool:
        """Whether GPUs of this kind talk over NVLink (else PCIe or another fabric): the catalog's
        interconnect names the primary link first; "PCIe ... (no NVLink)" or "PCIe ... (NVLink bridge
        pairs)" are PCIe hosts."""
        return self.interconnect.strip().lower().startswith("nvlink")

    def __post_init__(self) -> None:
        require(self.bf16_flops_per_s > 0, "bf16_flops_per_s", self.bf16_flops_per_s, "must be > 0")
        require(self.hbm_bytes_per_s > 0, "hbm_bytes_per_s", self.hbm_bytes_per_s, "must be > 0")
        require(self.memory_bytes > 0, "memory_bytes", self.memory_bytes, "must be > 0")
        require(self.interconnect_bytes_per_s > 0, "interconnect_bytes_per_s",
                self.interconnect_bytes_per_s, "must be > 0")


def _row_to_gpu(row: dict[str, str]) -> GPU:
    return GPU(
        name=row["name"],
        bf16_flops_per_s=float(row["bf16_flops_per_s"]),
        fp8_flops_per_s=float(row["fp8_flops_per_s"]) if row["fp8_flops_per_s"] else None,
        hbm_bytes_per_s=float(row["hbm_bytes_per_s"]),
        memory_bytes=int(row["memory_bytes"]),
        interconnect_bytes_per_s=float(row["interconnect_bytes_per_s"]),
        interconnect=row["interconnect"],
        source=row["source"],
        architecture=row.get("architecture", ""),
        compute_capability=row.get("compute_capability", ""),
        memory_type=row.get("memory_type", ""),
    )


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, GPU], dict[str, str]]:
    rows = read_catalog("gpus.csv")
    return {r["name"]: _row_to_gpu(r) for r in rows}, alias_index(rows)


def list_gpus() -> list[str]:
    """Canonical names of the GPUs in the catalog."""
    return sorted(_catalog()[0])


def get_gpu(name: str | GPU) -> GPU:
    """Look a GPU up by name or alias, case-insensitively ("h100" -> "h100-sxm")."""
    if isinstance(name, GPU):
        return name
    return lookup(*_catalog(), name, "gpu", "GPU")
