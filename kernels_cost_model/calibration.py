"""Calibrations: roofline coefficients per operator family (and per shape, operator, collective size)
for one device, fitted from measured kernels; save/load them as JSON; the deterministic hold-out split.

The fit of one family is roofline_fit.py; which coefficients price a kernel is shape_keys.py. Measured
all-reduce times are kept as curves by message size per group size (`curves["all_reduce@<ranks>"]`).
"""
from __future__ import annotations

import datetime as _dt
from functools import lru_cache
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from kernels_cost_model.errors import ConfigError, read_json_file, require, require_path

from .collectives import CollectiveCurve, measured_all_reduce
from .derived_defaults import GEMM_BENCHMARK_KEY, derivation, derived_coeffs, gemm_benchmark_device, shipped_defaults
from .matmul_regimes import Regimes, fit_regimes
from .prefill_waves import fa2_sms
from .roofline import (FAMILIES, OPTIONAL_FAMILIES, PREFILL_FAMILIES, SIDE_FAMILIES, SIDE_FIELDS, Coeffs,
                       operator_cost, operator_keys, operator_rows, operator_seqs, prefill_context_bytes,
                       single_token_prefill)
from .roofline_fit import fit_family, fit_tiled_or_not
from .shape_keys import attention_coeffs, coeffs_for_row, elementwise_key, kernel_cost, shape_key, side_terms

#: Efficiencies used where nothing was measured: typical fractions of datasheet peaks.
DEFAULT_EFFICIENCY = {  # family: (compute efficiency, memory efficiency, overhead seconds)
    "matmul": (0.70, 0.80, 6e-6),
    "elementwise": (0.50, 0.70, 4e-6),
    "prefill_attention": (0.55, 0.70, 8e-6),
    "decode_attention": (0.30, 0.70, 8e-6),
    "all_reduce": (1.00, 0.70, 1.5e-5),
}


#: In these families an operator with enough samples also gets its own coefficients
#: ("matmul.qkv_proj", "elementwise.rms_norm"); the family's own fit covers the rest.
PER_OPERATOR_FAMILIES = ("matmul", "elementwise")
PER_OPERATOR_MIN_SAMPLES = 4


@dataclass(frozen=True)
class Calibration:
    """Coefficients per family for one device, with where they came from."""

    device: str
    coeffs: dict[str, Coeffs]
    provenance: dict = field(default_factory=dict)
    #: Measured collective times: "all_reduce@<ranks>" -> [[message bytes, seconds], ...].
    curves: dict[str, list] = field(default_factory=dict)
    #: GEMM shapes priced by two rooflines ("matmul@<n>x<k>" -> Regimes, matmul_regimes.py); their
    #: one-regime fit stays in `coeffs` (off-grid shapes and the derived defaults read it).
    regimes: dict[str, Regimes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [f for f in FAMILIES if f not in self.coeffs]
        if missing:
            raise ConfigError("calibration.coeffs", sorted(self.coeffs), f"missing families {missing}")

    def to_json(self) -> dict:
        out = {"device": self.device,
               "coeffs": {f: _coeffs_json(c) for f, c in sorted(self.coeffs.items())},
               "provenance": self.provenance}
        if self.curves:
            out["curves"] = {k: v for k, v in sorted(self.curves.items())}
        if self.regimes:
            out["regimes"] = {k: r.to_json(_coeffs_json) for k, r in sorted(self.regimes.items())}
        return out


def _coeffs_json(c: Coeffs) -> dict:
    out = {"s_per_flop": c.s_per_flop, "s_per_byte": c.s_per_byte, "overhead_s": c.overhead_s,
           "tile_rows": c.tile_rows}
    if c.s_per_seq:
        out["s_per_seq"] = c.s_per_seq
    if c.s_per_key:
        out["s_per_key"] = c.s_per_key
    out.update({f: getattr(c, f) for f in SIDE_FIELDS if getattr(c, f)})
    return out


def default_coeffs(gpu, family: str) -> Coeffs:
    """Uncalibrated roofline coefficients for a catalog GPU (measured all-reduce figures where the
    collectives catalog has them)."""
    if family == "all_reduce":
        measured = measured_all_reduce(gpu.name)
        if measured is not None:
            return measured
    ce, me, overhead = DEFAULT_EFFICIENCY[family]
    bandwidth = gpu.interconnect_bytes_per_s / 2 if family == "all_reduce" else gpu.hbm_bytes_per_s
    return Coeffs(1.0 / (gpu.bf16_flops_per_s * ce), 1.0 / (bandwidth * me), overhead)


@lru_cache(maxsize=None)
def uncalibrated(gpu, derived: bool = True) -> Calibration:
    """Datasheet peaks x default efficiencies: the ones derived from the calibrated GPUs of the same
    architecture where shipped (derived_defaults.py), else DEFAULT_EFFICIENCY. A measured all-reduce
    of this GPU (collectives.csv) wins over both. Built once per GPU; shared, do not mutate."""
    coeffs = {f: default_coeffs(gpu, f) for f in FAMILIES}
    defaults = shipped_defaults() if derived else {}
    if not defaults:
        return Calibration(gpu.name, coeffs, {"kind": "uncalibrated roofline", "efficiencies": DEFAULT_EFFICIENCY})
    measured_ar = {"all_reduce": coeffs["all_reduce"]} if measured_all_reduce(gpu.name) else {}
    coeffs.update(derived_coeffs(gpu, defaults))
    coeffs.update(measured_ar)
    efficiencies = {f: derivation(gpu, defaults, f) for f in FAMILIES}
    if measured_ar:
        efficiencies["all_reduce"] = "measured all-reduce of this GPU (data/collectives.csv)"
    return Calibration(gpu.name, coeffs, {"kind": "uncalibrated roofline", "efficiencies": efficiencies,
                                          GEMM_BENCHMARK_KEY: gemm_benchmark_device(gpu, defaults)})


def derived_from(cal: Calibration, family: str = "matmul") -> str | None:
    """For an uncalibrated roofline with derived efficiencies, where `family`'s come from
    ("derived default (ada GPUs: l40s, rtx-4090)"); else None."""
    source = cal.provenance.get("efficiencies")
    found = source.get(family) if isinstance(source, dict) else None
    return found if isinstance(found, str) else None


# ---- fitting ---------------------------------------------------------------------------------

#: Fewest fit samples for a shape's own coefficients (matmul@n x k, attention@layout, moe@shape).
SHAPE_MIN_SAMPLES = 8


def costs(rows: list[dict], plain: bool = False) -> tuple[np.ndarray, ...]:
    """(FLOPs, bytes, measured seconds, tile rows, sequences, longest-row keys) arrays for profile rows.
    `plain`: bytes and launches only (an elementwise family's or operator's streaming rate, no tiers or
    row waves)."""
    fb = np.array([operator_cost(r) if plain else kernel_cost(r) for r in rows], dtype=float).reshape(-1, 2)
    seqs = np.zeros(len(rows)) if plain else np.array([operator_seqs(r) for r in rows], dtype=float)
    keys = np.array([operator_keys(r) for r in rows], dtype=float)
    return (fb[:, 0], fb[:, 1], np.array([r["measured_s"] for r in rows], dtype=float),
            np.array([operator_rows(r) for r in rows], dtype=float), seqs, keys)


def side_kernels(rows: list[dict], family: str) -> dict:
    """fit_family's `side` columns for a family in SIDE_FAMILIES (shape_keys.side_terms), else none."""
    if family not in SIDE_FAMILIES:
        return {}
    return {"side": np.array([side_terms(r) for r in rows], dtype=float).reshape(-1, len(SIDE_FIELDS))}


def _plain(family: str) -> bool:
    """Elementwise family and operator fits stay bytes-only: the tiered keys carry the mechanism."""
    return family == "elementwise"


def coeffs_for(cal: "Calibration", row: dict) -> Coeffs:
    """The coefficients that price a row: its shape's, its operator's ("matmul.qkv_proj"), its family's."""
    return coeffs_for_row(cal.coeffs, row)


def curve_for(cal: "Calibration", row: dict):
    """The measured collective curve that prices an all-reduce row, or None."""
    points = cal.curves.get(f'all_reduce@{int(row["tp"])}') if row["family"] == "all_reduce" else None
    if not points:
        return None
    return CollectiveCurve.from_points(points)


def context_floor(cal: Calibration, row: dict) -> float:
    """Seconds a prefill row's cached context takes at least, read at the decode fit's byte rate of the
    same head layout (roofline.prefill_context_bytes); 0 for other rows and on FA2 GPUs."""
    family = row["family"]
    if family not in PREFILL_FAMILIES or not row["context"] or fa2_sms(str(row.get("device", ""))):
        return 0.0
    decode = "decode_attention_l2" if family == "prefill_attention_l2" else "decode_attention"
    c = attention_coeffs(cal.coeffs, decode, row["num_heads"], row["num_kv_heads"], row["head_dim"])
    c = c or cal.coeffs.get(decode)
    nbytes = prefill_context_bytes(row["chunk"], row["context"], row["batch"], row["num_kv_heads"],
                                   row["head_dim"], int(row["dtype_bytes"]))
    return nbytes * c.s_per_byte if c is not None else 0.0


def predict(rows: list[dict], cal: Calibration) -> np.ndarray:
    """Predicted seconds of each profile row under a calibration."""
    out = np.empty(len(rows))
    for i, r in enumerate(rows):
        curve = curve_for(cal, r) if cal.curves else None
        if curve is not None:
            out[i] = curve.time(r["size_bytes"])
            continue
        plain = r["family"] == "elementwise" and elementwise_key(r) not in cal.coeffs  # no tier fitted
        flops, nbytes = operator_cost(r) if plain else kernel_cost(r)
        regimes = cal.regimes.get(shape_key(r)) if cal.regimes and r["family"] == "matmul" else None
        if regimes is not None:  # a GEMM shape with two rooflines (matmul_regimes.py)
            m = operator_rows(r)
            out[i] = regimes.time(regimes.low.time(flops, nbytes, m), regimes.high.time(flops, nbytes, m), m)
            continue
        out[i] = coeffs_for(cal, r).time(flops, nbytes, operator_rows(r), 0.0 if plain else operator_seqs(r),
                                         operator_keys(r), side_terms(r), memory_floor=context_floor(cal, r))
    return out


def relative_errors(rows: list[dict], cal: Calibration) -> dict[str, dict]:
    """Per family: count, median and worst |pred - t| / t."""
    out: dict[str, dict] = {}
    if not rows:
        return out
    err = np.abs(predict(rows, cal) / np.array([r["measured_s"] for r in rows]) - 1.0)
    fams = np.array([r["family"] for r in rows])
    for fam in sorted(set(fams)):
        e = err[fams == fam]
        out[str(fam)] = {"n": int(len(e)), "median_rel_err": float(np.median(e)), "max_rel_err": float(e.max())}
    return out


def _groups(rows: list[dict], key) -> dict:
    out: dict = {}
    for r in rows:
        k = key(r)
        if k is not None:
            out.setdefault(k, []).append(r)
    return out


def fit_profile(rows: list[dict], device: str, fallback: Calibration | None = None,
                sources: list[str] | None = None, two_regimes: bool = True) -> Calibration:
    """Fit every family present in `rows` (and each shape, operator and all-reduce group size with
    enough samples; a GEMM shape two regimes where they win, matmul_regimes.py, unless `two_regimes` is
    False); families absent keep `fallback`'s coefficients."""
    if not rows:
        raise ConfigError("profile", device, "no measurement rows to fit")
    coeffs = dict(fallback.coeffs) if fallback else {}
    rows = [r for r in rows if not single_token_prefill(r)]  # decodes as vLLM runs them (roofline.py)
    if not rows:
        raise ConfigError("profile", device, "no measurement rows to fit")
    by_family = _groups(rows, lambda r: r["family"])
    fitted = [f for f in (*FAMILIES, *OPTIONAL_FAMILIES) if len(by_family.get(f, ())) >= 2]
    for fam in fitted:
        coeffs[fam] = fit_family(*costs(by_family[fam], _plain(fam)), **side_kernels(by_family[fam], fam))
        if fam in PER_OPERATOR_FAMILIES:
            for op, op_rows in sorted(_groups(by_family[fam], lambda r: r["operator"]).items()):
                if op != fam and len(op_rows) >= PER_OPERATOR_MIN_SAMPLES:
                    coeffs[f"{fam}.{op}"] = fit_family(*costs(op_rows, _plain(fam)))
    shapes = {key: shape_rows for key, shape_rows in sorted(_groups(rows, shape_key).items())
              if len(shape_rows) >= SHAPE_MIN_SAMPLES}
    coeffs.update({key: _fit_shape(key, shape_rows) for key, shape_rows in shapes.items()})
    regimes = fit_regimes({key: _gemm_samples(r) for key, r in shapes.items() if key.startswith("matmul@")},
                          coeffs) if two_regimes else {}
    curves = {f"all_reduce@{tp}": sorted((r["size_bytes"], r["measured_s"]) for r in group)
              for tp, group in _groups(by_family.get("all_reduce", []), lambda r: int(r["tp"])).items()
              if len({r["size_bytes"] for r in group}) >= 2}
    missing = [f for f in FAMILIES if f not in coeffs]
    if missing:
        raise ConfigError("profile", device, f"no measurements for families {missing} and no fallback")
    provenance = {
        "kind": "fitted", "date": _dt.date.today().isoformat(),
        "sources": sorted(set(sources or [r["source"].split(" [")[0] for r in rows])),
        "samples": {f: len(by_family.get(f, ())) for f in (*FAMILIES, *OPTIONAL_FAMILIES) if f in by_family
                    or f in FAMILIES},
        "fitted_families": fitted,
        "unfitted_families": {f: "default efficiencies (no measurements)" for f in FAMILIES if f not in fitted},
    }
    cal = Calibration(device, coeffs, provenance, {k: [list(p) for p in v] for k, v in curves.items()}, regimes)
    provenance["fit_error"] = relative_errors(rows, cal)
    return cal


def _gemm_samples(rows: list[dict]) -> tuple[np.ndarray, ...]:
    """(rows, FLOPs, bytes, seconds) of a GEMM shape's profile rows, as matmul_regimes.fit_regimes reads them."""
    flops, nbytes, seconds, tile_rows, _seqs, _keys = costs(rows)
    return tile_rows, flops, nbytes, seconds


def _fit_shape(key: str, rows: list[dict]) -> Coeffs:
    """A shape key's coefficients: a GEMM shape keeps its tile-rows term only where cross-validation on
    its own rows supports it (roofline_fit.fit_tiled_or_not)."""
    flops, nbytes, seconds, tile_rows, seqs, keys = costs(rows)
    if key.startswith("matmul@"):
        return fit_tiled_or_not(flops, nbytes, seconds, tile_rows)
    return fit_family(flops, nbytes, seconds, tile_rows, seqs, keys, **side_kernels(rows, key.split("@")[0]))


# ---- files -----------------------------------------------------------------------------------

def save_calibration(cal: Calibration, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal.to_json(), indent=2, sort_keys=True) + "\n")
    return path


def load_calibration(path: str | Path) -> Calibration:
    path = require_path("calibration", path, "a calibration JSON file")
    data = read_json_file("calibration", path, "unreadable calibration file")
    require(isinstance(data, dict) and isinstance(data.get("device"), str) and isinstance(data.get("coeffs"), dict)
            and all(isinstance(c, dict) for c in data["coeffs"].values()), "calibration", str(path),
            'unreadable calibration file: needs a "device" name and a "coeffs" table of one table per family,'
            " as servesim calibrate writes it")
    try:
        coeffs = {f: Coeffs(**c) for f, c in data["coeffs"].items()}
        regimes = {k: _regimes(k, v, path) for k, v in data.get("regimes", {}).items()}
        return Calibration(data["device"], coeffs, data.get("provenance", {}), data.get("curves", {}), regimes)
    except TypeError as exc:
        raise ConfigError("calibration", str(path), f"unreadable calibration file: {exc}") from exc


def _regimes(key: str, data, path: Path) -> Regimes:
    """A shape's two regimes from a calibration file, checked."""
    fields = f"regimes.{key}"
    require(isinstance(data, dict) and {"below", "above", "low", "high"} <= set(data), fields, str(path),
            'needs "below", "above", "low" and "high"')
    below, above = data["below"], data["above"]
    require(isinstance(below, (int, float)) and isinstance(above, (int, float)) and 0 < below < above,
            fields, f"below={below!r}, above={above!r}", "needs token counts 0 < below < above")
    require(isinstance(data["low"], dict) and isinstance(data["high"], dict), fields, str(path),
            '"low" and "high" must be coefficient tables')
    return Regimes(float(below), float(above), Coeffs(**data["low"]), Coeffs(**data["high"]))


@lru_cache(maxsize=None)
def shipped_calibration(gpu_name: str) -> Calibration | None:
    """The calibration shipped in data/calibration/<gpu>.json, or None (loaded once; shared, do not mutate)."""
    res = resources.files("kernels_cost_model").joinpath("data", "calibration", f"{gpu_name}.json")
    if not res.is_file():
        return None
    with resources.as_file(res) as p:
        return load_calibration(p)


# ---- deterministic hold-out ------------------------------------------------------------------

HOLDOUT_RULE = ("per (device, operator): sort the distinct shape keys (token count m, or chunk/context/"
                "batch, or message size); every 5th key starting at the 3rd (rank % 5 == 2) is held out")


def _shape_key(row: dict) -> tuple:
    return (row["m"], row["chunk"], row["context"], row["batch"], row["size_bytes"], row["tp"] * 0)


def holdout_split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(fit rows, held-out rows): ~20% of shapes, chosen by rank, never at random."""
    keys: dict[tuple, list] = {}
    for r in rows:
        keys.setdefault((r["device"], r["operator"]), []).append(_shape_key(r))
    held = {g: {k for i, k in enumerate(sorted(set(v))) if i % 5 == 2} for g, v in keys.items()}
    fit, out = [], []
    for r in rows:
        (out if _shape_key(r) in held[(r["device"], r["operator"])] else fit).append(r)
    return fit, out
