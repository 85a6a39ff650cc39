"""Fit roofline coefficients per operator family from a measured profile; save/load them as JSON.

The fit minimises squared *relative* error sum((pred - t) / t)^2 of
pred = max(F * s_per_flop, B * s_per_byte) + overhead_s. The max() makes it piecewise linear, so we
alternate: assign each sample to the compute or memory side under the current coefficients, solve the
weighted linear least-squares problem (rows divided by t), clip to >= 0, repeat until the assignment
stops changing. Families with no FLOPs (elementwise, all-reduce) are a single linear solve.
"""
from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from kernels_cost_model.errors import ConfigError

from .roofline import FAMILIES, Coeffs, operator_cost, operator_rows

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

    def __post_init__(self) -> None:
        missing = [f for f in FAMILIES if f not in self.coeffs]
        if missing:
            raise ConfigError("calibration.coeffs", sorted(self.coeffs), f"missing families {missing}")

    def to_json(self) -> dict:
        return {"device": self.device,
                "coeffs": {f: {"s_per_flop": c.s_per_flop, "s_per_byte": c.s_per_byte,
                               "overhead_s": c.overhead_s, "tile_rows": c.tile_rows}
                           for f, c in sorted(self.coeffs.items())},
                "provenance": self.provenance}


def default_coeffs(gpu, family: str) -> Coeffs:
    """Uncalibrated roofline coefficients for a catalog GPU (measured all-reduce figures where the
    collectives catalog has them)."""
    if family == "all_reduce":
        from .collectives import measured_all_reduce
        measured = measured_all_reduce(gpu.name)
        if measured is not None:
            return measured
    ce, me, overhead = DEFAULT_EFFICIENCY[family]
    bandwidth = gpu.interconnect_bytes_per_s / 2 if family == "all_reduce" else gpu.hbm_bytes_per_s
    return Coeffs(1.0 / (gpu.bf16_flops_per_s * ce), 1.0 / (bandwidth * me), overhead)


def uncalibrated(gpu) -> Calibration:
    return Calibration(gpu.name, {f: default_coeffs(gpu, f) for f in FAMILIES},
                       {"kind": "uncalibrated roofline", "efficiencies": DEFAULT_EFFICIENCY})


# ---- fitting ---------------------------------------------------------------------------------

def fit_family(flops: np.ndarray, nbytes: np.ndarray, seconds: np.ndarray,
               rows: np.ndarray | None = None, max_iter: int = 50, robust: bool = True) -> Coeffs:
    """Least squares on relative error of max(F a (1 + r0/rows), B b) + c (see module docstring).

    robust: then reweight (IRLS, weights 1/sqrt|relative error|) for ROBUST_ROUNDS rounds, which moves
    the fit towards least *absolute* relative error so a few odd kernels cannot drag the rest.
    """
    plain = _fit_lsq(flops, nbytes, seconds, rows, max_iter)
    return _reweight(plain, flops, nbytes, seconds, rows) if robust else plain


ROBUST_ROUNDS, ROBUST_FLOOR = 10, 0.005


def _predict_arrays(c: Coeffs, flops, nbytes, rows) -> np.ndarray:
    compute = flops * c.s_per_flop * (1.0 + c.tile_rows / rows)
    return np.where(flops > 0, np.maximum(compute, nbytes * c.s_per_byte), nbytes * c.s_per_byte) + c.overhead_s


def _reweight(c: Coeffs, flops, nbytes, seconds, rows) -> Coeffs:
    flops, nbytes, seconds = (np.asarray(x, dtype=float) for x in (flops, nbytes, seconds))
    rows = np.ones_like(flops) if rows is None else np.maximum(np.asarray(rows, dtype=float), 1.0)
    w = 1.0 / seconds
    tiled = len(np.unique(rows)) > 1
    for _ in range(ROBUST_ROUNDS):
        g = 1.0 / np.sqrt(np.maximum(np.abs(_predict_arrays(c, flops, nbytes, rows) * w - 1.0), ROBUST_FLOOR))
        if not flops.any():
            sol = _nnls_lite(np.column_stack([nbytes * w * g, w * g]), g)
            c = Coeffs(0.0, float(sol[0]), float(sol[1]))
            continue
        side = flops * c.s_per_flop * (1.0 + c.tile_rows / rows) >= nbytes * c.s_per_byte
        tile = np.where(side, flops / rows, 0.0) if tiled else np.zeros_like(w)
        cols = [np.where(side, flops, 0.0), np.where(side, 0.0, nbytes), tile, np.ones_like(w)]
        if not tiled:
            del cols[2]
        sol = _nnls_lite(np.column_stack(cols) * (w * g)[:, None], g)
        if not tiled:
            sol = np.array([sol[0], sol[1], 0.0, sol[2]])
        c = Coeffs(float(sol[0]), float(sol[1]), float(sol[3]), float(sol[2] / sol[0]) if sol[0] > 0 else 0.0)
    return c


def _fit_lsq(flops, nbytes, seconds, rows, max_iter: int) -> Coeffs:
    flops, nbytes, seconds = (np.asarray(x, dtype=float) for x in (flops, nbytes, seconds))
    rows = np.ones_like(flops) if rows is None else np.maximum(np.asarray(rows, dtype=float), 1.0)
    if len(seconds) < 2:
        raise ConfigError("profile", len(seconds), "need at least 2 measurements to fit a family")
    w, ones = 1.0 / seconds, np.ones_like(seconds)
    if not flops.any():
        sol = _nnls_lite(np.column_stack([nbytes * w, w]), ones)
        return Coeffs(0.0, float(sol[0]), float(sol[1]))
    tiled = len(np.unique(rows)) > 1
    # The compute/memory boundary is (nearly) a threshold on arithmetic intensity F/B: start from
    # several thresholds, refine each by alternating assignment and solve, keep the best.
    intensity = flops / np.maximum(nbytes, 1e-300)
    starts = np.unique(np.quantile(intensity, np.linspace(0.0, 1.0, 21)))
    best, best_loss = None, np.inf
    for threshold in [np.inf, *starts]:
        sol = _refine(flops, nbytes, rows, w, intensity >= threshold, tiled, max_iter)
        pred = np.maximum(flops * (sol[0] + sol[2] / rows), nbytes * sol[1]) + sol[3]
        loss = float(np.sum((pred * w - 1.0) ** 2))
        if best is None or loss < best_loss * (1.0 - 1e-12):
            best, best_loss = sol, loss
    tile_rows = float(best[2] / best[0]) if best[0] > 0 else 0.0
    return Coeffs(float(best[0]), float(best[1]), float(best[3]), tile_rows)


def _refine(flops, nbytes, rows, w, side, tiled: bool, max_iter: int) -> np.ndarray:
    """Alternate: solve the linear problem for a compute/memory assignment, then reassign."""
    ones = np.ones_like(w)
    sol = np.zeros(4)
    for _ in range(max_iter):
        cols = [np.where(side, flops, 0.0), np.where(side, 0.0, nbytes), np.where(side, flops / rows, 0.0), ones]
        if tiled:
            sol = _nnls_lite(np.column_stack(cols) * w[:, None], ones)
        else:
            s3 = _nnls_lite(np.column_stack([cols[0], cols[1], ones]) * w[:, None], ones)
            sol = np.array([s3[0], s3[1], 0.0, s3[2]])
        new_side = flops * (sol[0] + sol[2] / rows) >= nbytes * sol[1]
        if np.array_equal(new_side, side):
            break
        side = new_side
    return sol


def _nnls_lite(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients by active-set elimination (few columns)."""
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active] / scale[active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0.0
            x[active] = sol / scale[active]
            return x
        active.pop(int(np.argmin(sol)))
    return x


def costs(rows: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(FLOPs, bytes, measured seconds, tile rows) arrays for profile rows."""
    fb = np.array([operator_cost(r) for r in rows], dtype=float).reshape(-1, 2)
    return (fb[:, 0], fb[:, 1], np.array([r["measured_s"] for r in rows], dtype=float),
            np.array([operator_rows(r) for r in rows], dtype=float))


def coeffs_for(cal: "Calibration", row: dict) -> Coeffs:
    """Operator-specific coefficients (e.g. "matmul.qkv_proj") when fitted, else the family's."""
    return cal.coeffs.get(f'{row["family"]}.{row["operator"]}') or cal.coeffs[row["family"]]


def predict(rows: list[dict], cal: Calibration) -> np.ndarray:
    """Predicted seconds of each profile row under a calibration."""
    return np.array([coeffs_for(cal, r).time(*operator_cost(r), operator_rows(r)) for r in rows])


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


def fit_profile(rows: list[dict], device: str, fallback: Calibration | None = None,
                sources: list[str] | None = None) -> Calibration:
    """Fit every family present in `rows`; families absent keep `fallback`'s coefficients."""
    if not rows:
        raise ConfigError("profile", device, "no measurement rows to fit")
    coeffs = dict(fallback.coeffs) if fallback else {}
    fitted = []
    for fam in FAMILIES:
        sel = [r for r in rows if r["family"] == fam]
        if len(sel) >= 2:
            coeffs[fam] = fit_family(*costs(sel))
            fitted.append(fam)
        for op in sorted({r["operator"] for r in sel}):
            op_rows = [r for r in sel if r["operator"] == op]
            if fam in PER_OPERATOR_FAMILIES and len(op_rows) >= PER_OPERATOR_MIN_SAMPLES:
                coeffs[f"{fam}.{op}"] = fit_family(*costs(op_rows))
    missing = [f for f in FAMILIES if f not in coeffs]
    if missing:
        raise ConfigError("profile", device, f"no measurements for families {missing} and no fallback")
    provenance = {
        "kind": "fitted", "date": _dt.date.today().isoformat(),
        "sources": sorted(set(sources or [r["source"].split(" [")[0] for r in rows])),
        "samples": {f: sum(r["family"] == f for r in rows) for f in FAMILIES},
        "fitted_families": fitted,
        "unfitted_families": {f: "default efficiencies (no measurements)" for f in FAMILIES if f not in fitted},
        "fit_error": relative_errors(rows, Calibration(device, coeffs)),
    }
    return Calibration(device, coeffs, provenance)


# ---- files -----------------------------------------------------------------------------------

def save_calibration(cal: Calibration, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal.to_json(), indent=2, sort_keys=True) + "\n")
    return path


def load_calibration(path: str | Path) -> Calibration:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        coeffs = {f: Coeffs(**c) for f, c in data["coeffs"].items()}
        return Calibration(data["device"], coeffs, data.get("provenance", {}))
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ConfigError("calibration", str(path), f"unreadable calibration file: {exc}") from exc


def shipped_calibration(gpu_name: str) -> Calibration | None:
    """The calibration shipped in data/calibration/<gpu>.json, or None."""
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
