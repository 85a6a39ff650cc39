"""Build the shipped calibration of every GPU with public kernel measurements.

Sources, read in place from the shared data folder (never copied; see data/NOTICE.md):

| GPU | AIConfigurator (vLLM tables) | other |
|---|---|---|
| a100-sxm-80gb | a100_sxm (vLLM 0.14.0) | - (not Vidur's eager norms: see SOURCES) |
| h100-sxm, h200 | h100_sxm, h200_sxm (0.24.0) | servesim's own torch-backend measurement (norms, activations) |
| b200, b300, gb200, gb300, l40s | their system folders (vLLM 0.24.0) | - |
| arc-pro-b60 (Intel) | b60 (vLLM 0.20.1.dev3, eager all-reduce) | - |
| rtx-pro-6000 | rtx_pro_6000_server (0.24.0) | LLMServingSim vLLM 0.19 per-layer profiles |
| rtx-4090 | - | LLMServingSim vLLM 0.19 per-layer profiles |
| rtx-pro-6000@vllm-0.19 (named variant) | - | LLMServingSim vLLM 0.19 per-layer profiles only |

A named variant `<gpu>@<tag>` is a second calibration of the same GPU from a subset of its sources (e.g.
only the vLLM version a user runs); it ships as data/calibration/<gpu>@<tag>.json, is picked by name
(`make_cost_model(calibration=NAME)`, `servesim run --calibration NAME`) and never feeds the derived
defaults.

Each device's rows are split by `holdout_split` (every 5th distinct shape by rank); the fit sees only
the fit split, and the error on the held-out split is recorded in the file. Families a device has no
measurements for (elementwise on the GPUs with AIConfigurator tables only) take the derived defaults of its
architecture (derived_defaults.py), and the file says so.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from .aiconfigurator_tables import LICENCE as AIC_LICENCE
from .aiconfigurator_tables import SYSTEMS, read_system
from .derived_defaults import (GEMM_BENCHMARK_KEY, derivation, derive_defaults, derived_coeffs, gemm_benchmark_device,
                               shipped_defaults)
from .calibration import (HOLDOUT_RULE, Calibration, fit_profile, holdout_split, relative_errors,
                          shipped_calibration, uncalibrated)
from .hardware import get_gpu
from .llmservingsim_profiles import LICENCE as LSS_LICENCE
from .llmservingsim_profiles import read_shared_profiles
from .profile_schema import read_profile
from .roofline import COEFF_FIELDS, FAMILIES, Coeffs

MEASURED_DIR = Path(__file__).parent / "data" / "measured"
"""servesim's own kernel profiles (benchmarks/measure_gpu_profile.py), with the device, driver, software and
date of each run in `<gpu>-torch.env.json`."""
MEASURED_LICENCE = ("measurements: servesim's own, benchmarks/measure_gpu_profile.py on the GPU itself "
                    "(kernels_cost_model/data/measured/<gpu>-torch.env.json: device, driver, software, date)")
#: Families fitted to servesim's own measurements: the norms and activations, compiled by Inductor as vLLM's
#: default torch.compile path runs them (a repeat run on a fresh process agrees within 0.8 / 1.6 % at the
#: median on H100 / H200). Its matmuls and attention are the same libraries but not vLLM's build of them
#: (cuBLAS through PyTorch, FlashAttention-2, a Triton paged decode): AIConfigurator's tables of vLLM's own
#: layers stay their source, and these rows check those fits (benchmarks/measured_check.py).
MEASURED_FAMILIES = ("elementwise",)
#: No calibration reads Vidur's per-layer profiles (vidur_profiles.py) any more: their norms and activations
#: time eager PyTorch layers, not the fused kernels vLLM serves with. Against servesim's own H100 measurement
#: of the compiled kernels (benchmarks/measured_check.py), an H100 fit to them priced rms_norm +170 %,
#: add_rms_norm +55 % and embedding +88 % (median 47 % over six operators); the two-tier default derived from
#: the GPUs measured under vLLM (derived_defaults.py) is 27 % off there (rms_norm +1 %, add_rms_norm +0 %).
#: device -> (AIConfigurator system or None, LLMServingSim hardware folder or None)
SOURCES = {
    "a100-sxm-80gb": ("a100_sxm", None),
    "h100-sxm": ("h100_sxm", None),
    "h200": ("h200_sxm", None),
    "b200": ("b200_sxm", None),
    "b300": ("b300_sxm", None),
    "gb200": ("gb200", None),
    "gb300": ("gb300", None),
    "l40s": ("l40s", None),
    "rtx-pro-6000": ("rtx_pro_6000_server", "RTXPRO6000"),
    "rtx-4090": (None, "RTX4090"),
    "arc-pro-b60": ("b60", None),
    "rtx-pro-6000@vllm-0.19": (None, "RTXPRO6000"),
}


def device_of(name: str) -> str:
    """The GPU a calibration name is for: `rtx-pro-6000@vllm-0.19` -> `rtx-pro-6000`."""
    return name.split("@", 1)[0]


def measured_profile(device: str) -> Path | None:
    """servesim's own torch-backend profile of `device`, shipped in the package, if there is one."""
    path = MEASURED_DIR / f"{device}-torch.profile.csv"
    return path if path.is_file() else None


def measured_rows(device: str) -> list[dict]:
    """The rows of `device`'s own profile in MEASURED_FAMILIES (none without a profile)."""
    path = measured_profile(device)
    return [r for r in read_profile(path) if r["family"] in MEASURED_FAMILIES] if path else []


def device_rows(root: str | Path, device: str) -> list[dict]:
    """Every measured kernel of one device (or named variant: only its listed sources), in a fixed order."""
    system, hardware = SOURCES[device]
    rows: list[dict] = measured_rows(device) if device_of(device) == device else []
    if hardware:
        rows += read_shared_profiles(root, hardware)
    if system:
        assert SYSTEMS[system] == device, (system, device)
        rows += read_system(root, system)
    return rows


def software_versions(rows: list[dict]) -> list[str]:
    """The runtime versions the rows' sources name ("vLLM 0.24.0", "vLLM 0.19.0")."""
    found = set()
    for r in rows:
        own = re.match(r"servesim torch backend \S+ \((torch [^,]*, CUDA [^,]*, triton [^,]*)", r["source"])
        if own:
            found.add(f"servesim torch backend ({own.group(1)})")
            continue
        match = re.search(r"\((vLLM [^)]*)\)", r["source"])
        found.add(match.group(1) if match else "LLMServingSim profiler, vLLM 0.19.0")
    return sorted(found)


def fit_device(root: str | Path, name: str, fallback: Calibration | None = None) -> tuple[Calibration, list]:
    """(calibration `name` fitted on its device's fit split, its held-out rows) with provenance recorded."""
    device = device_of(name)
    rows = device_rows(root, name)
    fit_rows, held = holdout_split(rows)
    cal = fit_profile(fit_rows, device, fallback=fallback or uncalibrated(get_gpu(device), derived=False))
    system, hardware = SOURCES[name]
    cal.provenance.update({
        "licence": [lic for lic, used in ((AIC_LICENCE, system), (LSS_LICENCE, hardware),
                                          (MEASURED_LICENCE, any(r["source"].startswith("servesim") for r in rows)))
                    if used],
        "software": software_versions(rows),
        "holdout_rule": HOLDOUT_RULE, "holdout_samples": len(held),
        "holdout_error": relative_errors(held, cal),
    })
    cal.provenance.pop("fit_error", None)  # the held-out error is the one that counts; keep files small
    return cal, held


def fit_all(root: str | Path, devices=None) -> tuple[dict[str, tuple[Calibration, list]], dict]:
    """Fit every device with measurements, derive the defaults from them, then give each device the
    derived default of each family it lacks. Returns ({device: (calibration, held-out rows)}, defaults)."""
    fits = {d: fit_device(root, d) for d in (devices or SOURCES)}
    base = {d: cal for d, (cal, _) in fits.items() if device_of(d) == d}     # named variants do not vote
    every = {d for d in SOURCES if device_of(d) == d}
    # a partial refit keeps the shipped defaults: a few GPUs alone would derive narrower ones
    defaults = derive_defaults(base, {d: get_gpu(d) for d in base}) if set(base) == every else shipped_defaults()
    out = {}
    for device, (cal, held) in fits.items():
        filled = rounded(with_derived_families(cal, get_gpu(device_of(device)), defaults))
        filled.provenance["holdout_error"] = relative_errors(held, filled)
        out[device] = (filled, held)
    return out, defaults


def rounded(cal: Calibration, digits: int = 6) -> Calibration:
    """The calibration with coefficients and curve times to `digits` significant digits (small files;
    the held-out error is computed after rounding, so the file reproduces it exactly)."""
    def r(x: float) -> float:
        return float(f"{x:.{digits}g}")
    coeffs = {k: Coeffs(*(r(getattr(c, f)) for f in COEFF_FIELDS)) for k, c in cal.coeffs.items()}
    curves = {k: [[size, r(sec)] for size, sec in v] for k, v in cal.curves.items()}
    regimes = {k: dataclasses.replace(g, low=Coeffs(*(r(getattr(g.low, f)) for f in COEFF_FIELDS)),
                                      high=Coeffs(*(r(getattr(g.high, f)) for f in COEFF_FIELDS)))
               for k, g in cal.regimes.items()}
    return Calibration(cal.device, coeffs, cal.provenance, curves, regimes)


def with_derived_families(cal: Calibration, gpu, defaults: dict) -> Calibration:
    """The calibration with each family it has no measurements of taken from the derived defaults."""
    missing = [f for f in FAMILIES if f not in cal.provenance.get("fitted_families", ())]
    if not missing:
        return cal
    coeffs = {**cal.coeffs, **derived_coeffs(gpu, defaults, families=missing, shapes=False)}
    provenance = {**cal.provenance, "unfitted_families": {f: derivation(gpu, defaults, f) for f in missing}}
    return Calibration(cal.device, coeffs, provenance, cal.curves, cal.regimes)


def left_out_calibration(device: str, calibrations: dict[str, Calibration] | None = None,
                         shapes: bool = True) -> Calibration:
    """`device` as a GPU with no calibration: every family at the defaults derived (derive_defaults) from
    the *other* calibrated GPUs, at `device`'s datasheet peaks. `calibrations`: device -> Calibration to
    derive from (default: the shipped ones of every GPU in SOURCES); named variants (`<gpu>@<tag>`) and
    `device` itself never vote. `shapes`: also the per-shape keys of the same group (else families only)."""
    if calibrations is None:
        calibrations = {d: shipped_calibration(d) for d in SOURCES if device_of(d) == d}
    others = {d: c for d, c in calibrations.items() if device_of(d) == d and d != device_of(device)}
    defaults = derive_defaults(others, {d: get_gpu(d) for d in others})
    missing = [f for f in FAMILIES if f not in defaults["all"]]
    if missing:
        raise ValueError(f"no calibrated GPU other than {device} measured {missing}")
    gpu = get_gpu(device)
    coeffs = {f: Coeffs(0.0, 1e-12, 1e-5) for f in FAMILIES}  # placeholders: every family derives below
    coeffs.update(derived_coeffs(gpu, defaults, shapes=shapes))
    return Calibration(gpu.name, coeffs, {"kind": "leave one GPU out", "derived_from": sorted(others),
                                          "per_shape": shapes, GEMM_BENCHMARK_KEY: gemm_benchmark_device(gpu, defaults)})
