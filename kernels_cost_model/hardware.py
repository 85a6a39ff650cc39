"""GPU catalog: peak dense FLOP/s, memory bandwidth and size, interconnect; one cited source per row.

Figures are dense (never the 2:4-sparsity doubled numbers vendors headline) and live in
`data/gpus.csv`; this module only reads and validates them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from kernels_cost_model.errors import ConfigError, is_number, read_json_file, require

from ._catalog import alias_index, lookup, normalise, read_catalog


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


def _row_to_gpu(row: dict) -> GPU:
    """A GPU from a catalog row (strings) or a spec file's object (numbers; optional fields may be absent)."""
    return GPU(
        name=row["name"].strip(),
        bf16_flops_per_s=float(row["bf16_flops_per_s"]),
        fp8_flops_per_s=float(row["fp8_flops_per_s"]) if row.get("fp8_flops_per_s") else None,
        hbm_bytes_per_s=float(row["hbm_bytes_per_s"]),
        memory_bytes=int(float(row["memory_bytes"])),
        interconnect_bytes_per_s=float(row["interconnect_bytes_per_s"]),
        interconnect=row.get("interconnect", ""),
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
    """Look a GPU up by name or alias, case-insensitively ("h100" -> "h100-sxm"), or read the path of a
    JSON file of its datasheet figures (`gpu_from_file`)."""
    if isinstance(name, GPU):
        return name
    if str(name).endswith(".json"):
        return gpu_from_file(str(name))
    read = _FROM_FILES.get(normalise(str(name)))
    if read is not None:
        return read
    try:
        return lookup(*_catalog(), name, "gpu", "GPU")
    except ConfigError as exc:
        raise ConfigError(exc.field, exc.value, f"{exc.reason}; or the path of a JSON file of its datasheet"
                          " figures (docs/cost_model.md, 'GPUs with no calibration')") from None


#: GPUs read from spec files in this process, by name: code that carries a GPU by its name finds it again.
_FROM_FILES: dict[str, GPU] = {}


#: Fields of a GPU spec file: the catalog's columns (data/gpus.csv), in its SI units.
REQUIRED_FIELDS = ("name", "bf16_flops_per_s", "hbm_bytes_per_s", "memory_bytes", "interconnect_bytes_per_s",
                   "source")
OPTIONAL_FIELDS = ("fp8_flops_per_s", "interconnect", "architecture", "compute_capability", "memory_type")
NUMBER_FIELDS = ("bf16_flops_per_s", "fp8_flops_per_s", "hbm_bytes_per_s", "memory_bytes",
                 "interconnect_bytes_per_s")


@lru_cache(maxsize=None)
def gpu_from_file(path: str) -> GPU:
    """A GPU the catalog lacks, from a JSON object of its datasheet figures with the catalog's field names
    and units (FLOP/s, bytes/s, bytes; `source` says where they come from). Its name must not be a catalog
    GPU's: the name selects a shipped calibration and the measured figures kept per GPU. Priced as a GPU
    with no calibration (derived defaults by `architecture`, `memory_type` and link)."""
    spec = read_json_file("gpu", path, "cannot read the GPU spec file")
    _check_spec(spec, path)
    text = ("interconnect", "architecture", "compute_capability", "memory_type", "source")
    gpu = _row_to_gpu({**spec, **{f: str(spec.get(f) or "") for f in text}})
    known = _FROM_FILES.setdefault(normalise(gpu.name), gpu)
    require(known == gpu, f"gpu file {path}: name", gpu.name, "another GPU spec file read before gives this"
            " name other figures; give each GPU its own name")
    return gpu


def _check_spec(spec, path: str) -> None:
    """A named error for a spec file that is not one object of known fields, all required ones present,
    numbers positive, and a name of its own."""
    require(isinstance(spec, dict), "gpu", path, "a GPU spec file must hold one JSON object")
    missing = [f for f in REQUIRED_FIELDS if f not in spec]
    require(not missing, "gpu", path, f"missing field(s) {missing}; required: {list(REQUIRED_FIELDS)}")
    unknown = sorted(set(spec) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    require(not unknown, "gpu", path, f"unknown field(s) {unknown}; known: {[*REQUIRED_FIELDS, *OPTIONAL_FIELDS]}")
    field = f"gpu file {path}"
    for name in NUMBER_FIELDS:
        value = spec.get(name)
        if value is not None:
            require(is_number(value) and value > 0, f"{field}: {name}", value, "must be a number > 0")
    name = spec["name"]
    require(isinstance(name, str) and name.strip(), f"{field}: name", name, "must be a non-empty string")
    index = _catalog()[1]
    require(normalise(name) not in index, f"{field}: name", name,
            f"names the catalog's {index.get(normalise(name))!r}; give the GPU a name of its own")
