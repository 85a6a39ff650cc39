"""The host's GPU-to-GPU link as a deployment setting: NVLink or PCIe.

The GPU catalog (data/gpus.csv) names the link a GPU of that kind usually has; a deployment may say
otherwise (`interconnect="pcie"`: SXM-class GPUs on a PCIe host without NVLink; `"nvlink"`: PCIe cards
joined by NVLink bridges, where the catalog lists a bridge). On the catalog's own link, collectives are
priced from that host's measured curves (collectives.py, the calibration). On another link, they are
priced from the measured all-reduce efficiencies of the calibrated GPUs on that kind of link (the
`nvlink` / `pcie` groups of data/derived_defaults.json) at that link's rate: PCIe generation by
architecture from data/links.csv, the bridge rate from the catalog's note.
"""
from __future__ import annotations

import dataclasses
import re

from .errors import require
from .hardware import GPU
from .links import get_link

INTERCONNECTS = ("auto", "nvlink", "pcie")
#: PCIe generation of a host slot by GPU architecture (PCI-SIG rates in data/links.csv).
PCIE_LINK = {"ampere": "pcie4", "ada": "pcie4", "hopper": "pcie5", "blackwell": "pcie5", "cdna3": "pcie5"}


def native(gpu: GPU) -> str:
    """The link the catalog gives this GPU: "nvlink" or "pcie"."""
    return "nvlink" if gpu.has_nvlink else "pcie"


def host_gpu(gpu: GPU, interconnect: str | None = "auto") -> GPU:
    """`gpu` as installed on a host whose GPUs talk over `interconnect` (the same object on its own link)."""
    interconnect = interconnect or "auto"
    require(interconnect in INTERCONNECTS, "interconnect", interconnect, f"must be one of {INTERCONNECTS}")
    if interconnect in ("auto", native(gpu)):
        return gpu
    if interconnect == "pcie":
        link = get_link(PCIE_LINK.get(gpu.architecture, "pcie5"))
        return dataclasses.replace(gpu, interconnect=f"{link.name} x16 (deployment setting)",
                                   interconnect_bytes_per_s=2.0 * link.bytes_per_s)
    bridge = re.search(r"nvlink[^:]*:\s*([\d.]+)\s*GB/s", gpu.interconnect, re.IGNORECASE)
    require(bridge is not None, "interconnect", interconnect,
            f"{gpu.name} has no NVLink in the GPU catalog ({gpu.interconnect or 'no link listed'})")
    return dataclasses.replace(gpu, interconnect="NVLink bridge (deployment setting)",
                               interconnect_bytes_per_s=float(bridge.group(1)) * 1e9)
