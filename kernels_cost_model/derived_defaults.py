"""Default coefficients for a GPU with no calibration, derived from the calibrated GPUs.

Every fitted coefficient is read back as a fraction of its GPU's datasheet peak (compute efficiency =
peak FLOP/s x s_per_flop inverted, memory efficiency likewise against HBM bandwidth, or against the
interconnect for all-reduce) plus its absolute launch overhead, tile rows and per-sequence time (a MoE
fit's per-routed-row time at a reference bandwidth: `seq_scale`). The
default for a family is the median over the calibrated GPUs of the same architecture generation
(`GPU.architecture`; for all-reduce: the same interconnect class, NVLink or PCIe; for attention: the
same attention kernels, FlashAttention 2 or the architecture's own; for norms and activations: the same
kind of DRAM, HBM or GDDR), else over all of them. Shape keys (matmul@n x k, attention@layout) are derived the same way, so an uncalibrated Hopper
GPU prices a 4096 x 4096 GEMM at the efficiency H100 and H200 run it at; matmul shapes come from GEMM
grids only (a model layer's own shape from per-layer profiles is no grid point, shape_keys.py).
A GEMM shape key whose field-by-field medians would price it outside the range of its GPUs' own fits
takes the whole fit of the GPU in the middle instead (`_within_sources`).

`data/derived_defaults.json` holds the result (benchmarks/fit_shipped_calibration.py writes it), with
the GPUs each figure comes from.
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from statistics import median

from .prefill_waves import key_scale
from .l2_cache import l2_bytes
from .roofline import FAMILIES, KEY_FAMILIES, OPTIONAL_FAMILIES, SIDE_FAMILIES, SIDE_FIELDS, Coeffs
from .shape_keys import on_matmul_grid

FILE = "derived_defaults.json"


def _bandwidth(gpu, family: str) -> float:
    return gpu.interconnect_bytes_per_s / 2 if family == "all_reduce" else gpu.hbm_bytes_per_s


#: Bandwidth a MoE fit's cost per routed row is carried at (its per-row kernels stream the rows'
#: activations, so the cost scales with 1 / memory bandwidth from one GPU to another).
PER_ROW_REFERENCE_BYTES = 1e12


def seq_scale(gpu, family: str) -> float:
    """s_per_seq x this = the figure carried to another GPU: a MoE fit's cost per routed row at the
    reference bandwidth (roofline.operator_seqs); as fitted (1) for the other families."""
    return gpu.hbm_bytes_per_s / PER_ROW_REFERENCE_BYTES if family == "moe" else 1.0


#: Architectures whose vLLM runs its collectives through oneCCL (`xccl`, vllm/platforms/xpu.py), not NCCL or
#: vLLM's custom all-reduce: their all-reduce rates form a group of their own.
ONECCL_ARCHITECTURES = ("xe2",)
#: Architectures whose shape keys stay out of the all-GPU medians (their families still vote): their
#: kernels are other libraries (oneDNN GEMMs, XPU flash attention), whose per-shape efficiencies say
#: little about CUDA kernels', and their grids hold shapes the others lack (n or k = 32,768), which would
#: then steer the log-space interpolation of every GPU priced from all of them. Left out, the Arc Pro B60
#: itself shows it: priced from the NVIDIA GPUs' shape keys, matmul 24.8 % and prefill 35.5 % off (held-out
#: median), against 18.7 % and 19.0 % from their family figures.
OWN_SHAPES_ARCHITECTURES = ("xe2",)


#: Norms and activations are priced from the GPUs with the same kind of DRAM, not the same architecture.
#: Most launches in a forward pass read what the kernel before wrote, much of it from L2 (l2_cache.py), so
#: the family's rate, read as a multiple of DRAM bandwidth, depends on how slow the DRAM is next to the
#: chip: the fitted rates are 2.68x (RTX 4090, GDDR6X) and 2.34x (RTX PRO 6000, GDDR7) the DRAM's, about
#: 1.1x on the H100 (HBM3) and H200 (HBM3e). By architecture, an HBM B200 took the RTX PRO 6000's 2.34x
#: (18 TB/s) and a GPU left out found no other of its architecture with norms measured: left out, the
#: RTX 4090, RTX PRO 6000, H100 and H200 were 30.6 / 30.1 / 14.8 / 12.3 % off; by kind of DRAM, 23.5 / 15.6
#: / 14.8 / 12.3 % (benchmarks/cost_model_accuracy.py). These four cannot tell DRAM from kind of kernel
#: apart (vLLM's CUDA kernels on the two GDDR GPUs, Inductor's on the two HBM ones).
MEMORY_GROUPED_FAMILIES = ("elementwise",)


def group_of(gpu, family: str) -> str:
    """The group whose medians price this GPU's family: architecture; interconnect (or oneCCL) for all-reduce;
    for attention, the kernel family vLLM runs there (`attention_kernels`); for norms and activations, the
    memory's family (`GPU.memory_family`, MEMORY_GROUPED_FAMILIES)."""
    base = family.split("@")[0].split(".")[0]
    if base == "all_reduce":
        if gpu.architecture in ONECCL_ARCHITECTURES:
            return "oneccl"
        return "nvlink" if gpu.has_nvlink else "pcie"
    if base in ("prefill_attention", "decode_attention", "decode_attention_l2", "prefill_attention_l2"):
        return attention_kernels(gpu)
    if base in MEMORY_GROUPED_FAMILIES and gpu.memory_family:
        return gpu.memory_family
    return gpu.architecture or "unknown"


#: Compute capabilities whose special-function units compute exponentials at twice the rate of their
#: architecture's others: Blackwell Ultra (10.3) against Blackwell (10.0), NVIDIA's "Making Softmax More
#: Efficient with NVIDIA Blackwell Ultra" (developer.nvidia.com/blog). A prefill kernel's softmax runs on
#: those units, so these parts price attention from each other: AIConfigurator's prefill tables run 13-17 %
#: faster on B300 / GB300 than on B200 / GB200 at the same BF16 peak, and left out, B200's prefill is 4.8 %
#: off when priced from GB200 alone against 17.1 % from B300 and GB300 (B300 from GB300: 4.8 against 21.9 %).
DOUBLED_EXP_CAPABILITIES = ("10.3",)


def attention_kernels(gpu) -> str:
    """vLLM's default attention kernels on this GPU, as a group: "fa2" (FlashAttention 2) on Ampere, Ada
    and workstation Blackwell (sm_120: PCIe-only in the catalog; FlashAttention 3 needs sm_90a and does
    not build for sm_12x), else the architecture (Hopper: FlashAttention 3; datacenter Blackwell, sm_100:
    FlashInfer/TRT-LLM kernels), with Blackwell Ultra apart ("blackwell-ultra", `DOUBLED_EXP_CAPABILITIES`).
    Leave one GPU out, prefill attention is 5.0 % off at the median with these groups (14.0 % without the
    Ultra split, 16.6 % by architecture; benchmarks/cost_model_accuracy.py)."""
    arch = gpu.architecture or "unknown"
    if arch in ("ampere", "ada") or (arch == "blackwell" and not gpu.has_nvlink):
        return "fa2"
    if gpu.compute_capability in DOUBLED_EXP_CAPABILITIES:
        return f"{arch}-ultra"
    return arch


def to_efficiency(c: Coeffs, gpu, family: str) -> dict[str, float]:
    base = family.split("@")[0].split(".")[0]
    out = {"compute": 1.0 / (c.s_per_flop * gpu.bf16_flops_per_s) if c.s_per_flop else 0.0,
           "memory": 1.0 / (c.s_per_byte * _bandwidth(gpu, base)) if c.s_per_byte else 0.0,
           "overhead_s": c.overhead_s, "tile_rows": c.tile_rows, "s_per_seq": c.s_per_seq * seq_scale(gpu, base),
           "s_per_key": c.s_per_key * (key_scale(gpu, base) if base in KEY_FAMILIES else 1.0)}
    if base in SIDE_FAMILIES:  # seconds per side kernel and per split combined, as fitted
        out.update({f: getattr(c, f) for f in SIDE_FIELDS})
    return out


#: Most of its memory bandwidth a derived elementwise default streams at beyond the L2. A family fit
#: over every launch size reads above 1 where its small launches ran from L2 (the RTX PRO 6000's: 2.35);
#: carried as it is to another GPU, it prices large, DRAM-bound launches faster than that GPU's memory can
#: stream them (a B200's norms at 18 TB/s). So a derived default keeps the family's rate for launches
#: within the L2 (`L2_TIER_OPS`, the l2 tier of l2_cache.ElementwiseOp) and streams beyond it at this
#: share of the HBM at most. On servesim's own H100 and H200 measurements of the compiled kernels
#: (benchmarks/measured_check.py), RMSNorm, its fused add and RoPE from 512 tokens were 60 / 63 % off with
#: the family's rate throughout; below 512 tokens 10 / 8.5 %.
ELEMENTWISE_MAX_MEMORY_EFFICIENCY = 1.0
#: The elementwise operators a step prices (builder.make_cost_model), each given the family's derived
#: rate as its L2 tier.
L2_TIER_OPS = ("rms_norm", "add_rms_norm", "silu_mul", "rope", "add", "embedding")


def from_efficiency(e: dict, gpu, family: str, streaming: bool = True) -> Coeffs:
    """Coefficients of `gpu` at efficiencies `e` of its peaks; `streaming`: an elementwise default as it
    streams beyond the L2 (its memory efficiency capped at ELEMENTWISE_MAX_MEMORY_EFFICIENCY)."""
    base = family.split("@")[0].split(".")[0]
    memory = e["memory"]
    if base == "elementwise" and streaming:
        memory = min(memory, ELEMENTWISE_MAX_MEMORY_EFFICIENCY)
    return Coeffs(1.0 / (e["compute"] * gpu.bf16_flops_per_s) if e["compute"] else 0.0,
                  1.0 / (memory * _bandwidth(gpu, base)) if memory else 0.0,
                  e["overhead_s"], e["tile_rows"], e["s_per_seq"] / seq_scale(gpu, base),
                  e.get("s_per_key", 0.0) / (key_scale(gpu, base) if base in KEY_FAMILIES else 1.0),
                  *(e.get(f, 0.0) for f in SIDE_FIELDS))


def derive_defaults(calibrations: dict, gpus: dict) -> dict:
    """{"groups": {group: {key: efficiency}}, "all": {...}} from calibrations' fitted keys (4 significant
    digits; family keys also list the GPUs they come from).

    calibrations: device -> Calibration; gpus: device -> GPU. Only fitted families (and their shape and
    operator keys) count; a family a calibration took from defaults does not feed the defaults.
    """
    samples: dict[tuple[str, str], list] = {}
    for device, cal in sorted(calibrations.items()):
        fitted = set(cal.provenance.get("fitted_families", ()))
        for key, c in cal.coeffs.items():
            if key.split("@")[0].split(".")[0] not in fitted or "." in key:
                continue
            if key.startswith("matmul@") and not on_matmul_grid(cal.coeffs, key):
                continue  # a model layer's own shape (per-layer profiles): no GEMM grid to derive from
            e = to_efficiency(c, gpus[device], key)
            samples.setdefault((group_of(gpus[device], key), key), []).append((device, e))
            if "@" not in key or gpus[device].architecture not in OWN_SHAPES_ARCHITECTURES:
                samples.setdefault(("all", key), []).append((device, e))
    out: dict = {"groups": {}, "all": {}}
    for (group, key), items in sorted(samples.items()):
        merged = {f: float(f"{median(e[f] for _, e in items):.4g}") for f in items[0][1]}
        if key == "matmul" or key.startswith("matmul@"):
            merged = _within_sources(key, items, merged, [gpus[d] for d, _ in items])
        if "@" not in key:  # shape keys come from the same GPUs as their family
            merged["from"] = [d for d, _ in items]
        (out["all"] if group == "all" else out["groups"].setdefault(group, {}))[key] = merged
    return out


#: Rows a GEMM shape key is checked at (decode batches and a prefill chunk's worth).
CHECK_ROWS = (1, 64, 1024)
#: The GEMM the family key `matmul` is checked at (it prices shapes off every grid: a large
#: vocabulary's LM head, layers wider than the tables): a 4096-wide hidden layer's projection.
FAMILY_CHECK_KEY = "matmul@4096x4096"


def _gemm_time(key: str, e: dict, flops: float, bandwidth: float, rows: float) -> float:
    """Seconds of the BF16 `matmul@n x k` GEMM over `rows` rows at efficiencies `e` of the given peaks
    (as operators.MatmulOp prices it: tile-rounded compute or bytes, whichever is larger, + overhead);
    the family key `matmul` at FAMILY_CHECK_KEY's shape."""
    n, k = (float(v) for v in (key if "@" in key else FAMILY_CHECK_KEY).split("@")[1].split("x"))
    compute = 2.0 * (rows + e["tile_rows"]) * n * k / (e["compute"] * flops) if e["compute"] else 0.0
    memory = 2.0 * (rows * (n + k) + n * k) / (e["memory"] * bandwidth) if e["memory"] else 0.0
    return max(compute, memory) + e["overhead_s"]


def _within_sources(key: str, items: list, merged: dict, gpus: list) -> dict:
    """The per-field medians of a GEMM key (a shape's, or the family's) where they price it within the
    range of the source GPUs' own fits (at the sources' median peaks, at CHECK_ROWS), else the whole fit
    of the source GPU in the middle by priced time (the lower middle one for an even count; name breaks
    ties).

    A shape fit trades its terms against each other (a bandwidth term on one GPU, tile rows or a fitted-away
    term, efficiency 0, on another), so medians taken field by field can combine into a set no GPU was
    fitted to, priced slower or faster than all of them (docs/fidelity.md, leave one GPU out)."""
    flops = median(g.bf16_flops_per_s for g in gpus)
    bandwidth = median(g.hbm_bytes_per_s for g in gpus)
    own = [[_gemm_time(key, e, flops, bandwidth, r) for r in CHECK_ROWS] for _, e in items]
    mixed = [_gemm_time(key, merged, flops, bandwidth, r) for r in CHECK_ROWS]
    if all(min(t[i] for t in own) * (1 - 1e-3) <= m <= max(t[i] for t in own) * (1 + 1e-3)
           for i, m in enumerate(mixed)):
        return merged
    ranked = sorted(range(len(items)), key=lambda i: (sum(own[i]), items[i][0]))
    pick = items[ranked[(len(items) - 1) // 2]][1]
    return {f: float(f"{v:.4g}") for f, v in pick.items()}


def derived_coeffs(gpu, defaults: dict, families=(*FAMILIES, *OPTIONAL_FAMILIES),
                   shapes: bool = True) -> dict[str, Coeffs]:
    """Coefficients for `gpu` from derived defaults: its group's figure for each key, else all GPUs'."""
    out = {}
    keys = set(defaults.get("all", {}))
    for key in sorted(keys):
        family = key.split("@")[0]
        if family not in families or ("@" in key and not shapes):
            continue
        e = defaults["groups"].get(group_of(gpu, key), {}).get(key) or defaults["all"][key]
        out[key] = from_efficiency(e, gpu, key)
        if key == "elementwise" and l2_bytes(gpu.name):
            l2 = from_efficiency(e, gpu, key, streaming=False)
            out.update({f"elementwise.{op}@l2": l2 for op in L2_TIER_OPS})
    return out


#: Provenance key of a calibration whose GEMM shape keys are derived defaults: the calibrated GPU whose L2
#: says which of them the benchmark timed with their weights in L2 (weights_l2.py; operators.matmul_operator).
GEMM_BENCHMARK_KEY = "gemm_benchmark_device"


def gemm_benchmark_device(gpu, defaults: dict) -> str | None:
    """Of the calibrated GPUs `gpu`'s derived GEMM shape keys come from (its group's, as derived_coeffs picks
    them, else all GPUs'), the one with the largest L2 (name breaks ties); None without an L2 size.

    A derived `matmul@n x k` is a median of those GPUs' benchmark fits, each taken with the weight in L2
    where its 6 copies fit there (weights_l2.py), so a shape is judged by the largest donor L2 it may
    carry an L2 rate from, not by the target's L2: in serving the target reads it from DRAM whatever its
    L2. (The shape keys a group lacks and takes from all GPUs, Ampere's 35, hold weights of 50 MiB or
    more: in no donor's L2.)"""
    group = group_of(gpu, "matmul")
    entry = defaults.get("groups", {}).get(group, {}).get("matmul") or defaults.get("all", {}).get("matmul")
    sized = [d for d in (entry or {}).get("from", ()) if l2_bytes(d)]
    return max(sized, key=lambda d: (l2_bytes(d), d)) if sized else None


def donors(gpu, defaults: dict, family: str) -> str | None:
    """The calibrated GPUs `gpu`'s derived `family` coefficients come from, as `derived_coeffs` picks
    them: "ada GPUs: l40s, rtx-4090", else "all calibrated GPUs: ..." (a group none of them is in, e.g.
    an AMD GPU); None where none measured the family."""
    group = group_of(gpu, family)
    entry = defaults["groups"].get(group, {}).get(family)
    label = f"{group} GPUs" if entry else "all calibrated GPUs"
    entry = entry or defaults["all"].get(family)
    return None if entry is None else f"{label}: {', '.join(entry['from'])}"


def derivation(gpu, defaults: dict, family: str) -> str:
    """`donors` as a calibration's provenance states it."""
    found = donors(gpu, defaults, family)
    return "typical efficiency (no calibrated GPU measured this family)" if found is None else \
        f"derived default ({found})"


@lru_cache(maxsize=1)
def shipped_defaults() -> dict:
    """The derived defaults shipped in data/derived_defaults.json ({} when none is shipped)."""
    res = resources.files("kernels_cost_model").joinpath("data", FILE)
    return json.loads(res.read_text()) if res.is_file() else {}
