"""Two regimes per GEMM shape: cuBLAS, cuBLASLt and oneDNN hand a shape to another kernel as its rows
grow, so one roofline per (n, k) bends badly where the kernel changes. A shape whose measured token
counts are enough gets a second roofline: `low` prices rows up to `below`, `high` rows from `above`
(two neighbouring measured token counts), and rows between them a blend, linear in log rows of the
log times. A shape splits only where 5-fold cross-validation over its own fit rows (folds over token
counts) prefers the split by PICK_MARGIN; the held-out rows are never read.

The fit is batched: every shape's rooflines are refitted at once (Levenberg-Marquardt on the relative
error, reweighted towards least absolute relative error as roofline_fit.fit_family), from the shape's
one-regime coefficients. `benchmarks/matmul_residuals.py` measures the alternatives (a smooth knee, a
hard step at the switch) with the same fitter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .roofline import Coeffs

#: A shape takes two regimes only where its cross-validated median |error| beats one regime's by this
#: share (roofline_fit.fit_tiled_or_not's margin for the tile term).
PICK_MARGIN = 0.1
#: Fewest measured token counts on each side of a switch.
SIDE_MIN_COUNTS = 4
FOLDS = 5


@dataclass(frozen=True)
class Regimes:
    """A GEMM shape's two rooflines: `low` up to `below` rows, `high` from `above`, blended between."""

    below: float
    above: float
    low: Coeffs
    high: Coeffs

    def time(self, low_s: float, high_s: float, rows: float) -> float:
        """Seconds at `rows` from the two regimes' seconds there."""
        return blended(low_s, high_s, rows, self.below, self.above)

    def scaled(self, flop: float, byte: float) -> "Regimes":
        """Both regimes with their seconds per FLOP and per byte scaled."""
        def scale(c: Coeffs) -> Coeffs:
            return replace(c, s_per_flop=c.s_per_flop * flop, s_per_byte=c.s_per_byte * byte)
        return replace(self, low=scale(self.low), high=scale(self.high))

    def to_json(self, coeffs_json) -> dict:
        return {"below": self.below, "above": self.above, "low": coeffs_json(self.low),
                "high": coeffs_json(self.high)}


def blended(low_s: float, high_s: float, rows: float, below: float, above: float) -> float:
    """The low regime's seconds up to `below` rows, the high one's from `above`, and between them the
    blend of their logs with the high regime's weight linear in log rows."""
    if rows <= below:
        return low_s
    if rows >= above:
        return high_s
    w = math.log(rows / below) / math.log(above / below)
    if low_s <= 0.0 or high_s <= 0.0:  # a zero (a user's overhead of 0): no log, the plain blend
        return (1.0 - w) * low_s + w * high_s
    return math.exp((1.0 - w) * math.log(low_s) + w * math.log(high_s))


# ---- the batched roofline fit ------------------------------------------------------------------

def roofline_times(theta: np.ndarray, cols: dict, tiled: np.ndarray, p: float = np.inf
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, d seconds / d theta) of padded (shape x row) arrays; theta: per shape log (s_per_flop,
    s_per_byte, overhead_s, tile_rows), the tile term only where `tiled`. `cols`: m (rows), F (FLOPs), B
    (bytes). p = inf is the roofline's max of compute and memory; a finite p a smooth knee
    (C^p + M^p)^(1/p) (benchmarks/matmul_residuals.py --knee)."""
    a, b, o = (np.exp(theta[:, j:j + 1]) for j in range(3))
    tile = np.where(tiled[:, None], np.exp(theta[:, 3:4]), 0.0)
    compute, memory = cols["F"] * a * (1.0 + tile / cols["m"]), cols["B"] * b
    if p == np.inf:
        top = np.maximum(compute, memory)
        d_c = (compute >= memory).astype(float)
        d_m = 1.0 - d_c
    else:
        scale = np.maximum(np.maximum(compute, memory), 1e-300)
        top = scale * ((compute / scale) ** p + (memory / scale) ** p) ** (1.0 / p)
        d_c, d_m = (compute / top) ** (p - 1.0), (memory / top) ** (p - 1.0)
    grad = np.stack([d_c * compute, d_m * memory, np.broadcast_to(o, compute.shape),
                     np.where(tiled[:, None], d_c * cols["F"] * a * tile / cols["m"], 0.0)], axis=-1)
    return top + o, grad


def fit_batched(theta: np.ndarray, cols: dict, weight: np.ndarray, tiled: np.ndarray, p: float = np.inf,
                rounds: int = 6, iters: int = 40) -> np.ndarray:
    """Every shape's theta fitted at once to `cols["t"]` (rows of weight 0 left out; a shape with no
    rows keeps its start); per-shape damping."""
    theta, t = theta.copy(), cols["t"]
    g = np.ones_like(t)
    for _ in range(rounds):
        damping = np.full(len(theta), 1e-3)
        pred, grad = roofline_times(theta, cols, tiled, p)
        r = (pred / t - 1.0) * weight
        loss = np.sum((g * r) ** 2, axis=1)
        for _ in range(iters):
            jac = grad / t[..., None] * (g * weight)[..., None]
            normal = np.einsum("srk,srl->skl", jac, jac)
            rhs = -np.einsum("srk,sr->sk", jac, g * r)
            diag = np.einsum("skk->sk", normal)
            lhs = normal + damping[:, None, None] * np.eye(4) * diag[:, None, :] + 1e-9 * np.eye(4)
            step = np.clip(np.linalg.solve(lhs, rhs[..., None])[..., 0], -3.0, 3.0)
            step[~tiled, 3] = 0.0
            new_pred, new_grad = roofline_times(theta + step, cols, tiled, p)
            new_r = (new_pred / t - 1.0) * weight
            new_loss = np.sum((g * new_r) ** 2, axis=1)
            better = new_loss < loss
            theta[better] += step[better]
            loss[better], r[better], grad[better] = new_loss[better], new_r[better], new_grad[better]
            damping = np.where(better, damping * 0.3, damping * 10.0)
            if (damping > 1e7).all():
                break
        g = 1.0 / np.sqrt(np.maximum(np.abs(r), 0.005))
    return theta


def start_theta(coeffs: list[Coeffs]) -> tuple[np.ndarray, np.ndarray]:
    """(theta, tiled) of fit_batched from one-regime coefficients."""
    theta = np.log([[max(c.s_per_flop, 1e-20), max(c.s_per_byte, 1e-20), max(c.overhead_s, 1e-7),
                     max(c.tile_rows, 1e-3)] for c in coeffs])
    return theta, np.array([c.tile_rows > 0 for c in coeffs])


def theta_coeffs(theta: np.ndarray, tiled: bool) -> Coeffs:
    a, b, o, tile = (float(math.exp(x)) for x in theta)
    return Coeffs(a, b, o, tile if tiled else 0.0)


def padded(samples: list[tuple[np.ndarray, ...]]) -> tuple[dict, np.ndarray]:
    """Padded (shape x row) columns m, F, B, t of per-shape (rows, FLOPs, bytes, seconds) arrays, and the
    mask of real rows."""
    width = max(len(s[0]) for s in samples)
    cols = {c: np.ones((len(samples), width)) for c in ("m", "F", "B", "t")}
    mask = np.zeros((len(samples), width))
    for i, sample in enumerate(samples):
        size = len(sample[0])
        for c, values in zip(("m", "F", "B", "t"), sample):
            cols[c][i, :size] = values
        mask[i, :size] = 1.0
    return cols, mask


# ---- choosing and fitting the regimes ----------------------------------------------------------

def cv_errors(predict, cols: dict, mask: np.ndarray, fold: np.ndarray) -> list[np.ndarray]:
    """Per variant that `predict(weight, cols)` returns, the 5-fold cross-validated |error| of every
    real row (NaN on padding)."""
    out: list[np.ndarray] = []
    for k in range(FOLDS):
        held = (fold == k) & (mask > 0)
        variants = predict(mask * ~held, cols)
        out = out or [np.full_like(cols["t"], np.nan) for _ in variants]
        for e, v in zip(out, variants):
            e[held] = np.abs(v / cols["t"] - 1.0)[held]
    return out


def picks(cv: list[np.ndarray]) -> np.ndarray:
    """Per shape, the index of the option its cross-validation picks: 0 (the first) unless another's
    median beats it by PICK_MARGIN; options whose median is NaN never win."""
    medians = np.array([np.nanmedian(np.where(np.isnan(e).all(axis=1, keepdims=True), np.inf, e), axis=1)
                        for e in cv]).T
    if medians.shape[1] == 1:
        return np.zeros(len(medians), dtype=int)
    best = 1 + np.argmin(medians[:, 1:], axis=1)
    return np.where(medians[np.arange(len(medians)), best] < (1.0 - PICK_MARGIN) * medians[:, 0], best, 0)


def fit_regimes(samples: dict[str, tuple[np.ndarray, ...]], coeffs: dict[str, Coeffs]) -> dict[str, Regimes]:
    """{shape key: Regimes} for the GEMM shapes where two regimes win. `samples`: shape key -> (rows,
    FLOPs, bytes, seconds) of its fit rows; `coeffs`: the one-regime fits, every refit's start. Shapes
    measured at the same token counts (a GEMM table's grid) are fitted together, their folds and
    switches over those counts."""
    grids: dict[tuple, list[str]] = {}
    for key in sorted(samples):
        counts = tuple(np.unique(samples[key][0]))
        if key in coeffs and len(counts) >= 2 * SIDE_MIN_COUNTS:
            grids.setdefault(counts, []).append(key)
    return {k: g for keys in grids.values() for k, g in _fit_grid(keys, samples, coeffs).items()}


def _fit_grid(keys: list[str], samples: dict, coeffs: dict) -> dict[str, Regimes]:
    """fit_regimes for shapes measured at the same token counts."""
    cols, mask = padded([samples[k] for k in keys])
    theta, tiled = start_theta([coeffs[k] for k in keys])
    ms = np.unique(cols["m"][mask > 0])
    fold = np.searchsorted(ms, cols["m"]) % FOLDS

    def refit(weight, at):
        return roofline_times(fit_batched(theta, cols, weight, tiled), at, tiled)[0]

    switches = [(ms[i - 1], ms[i]) for i in range(1, len(ms))]
    options = [cv_errors(lambda w, c: (refit(w, c),), cols, mask, fold)[0]]
    for below, above in switches:
        low, high = mask * (cols["m"] <= below), mask * (cols["m"] >= above)
        enough = (_counts(cols, low) >= SIDE_MIN_COUNTS) & (_counts(cols, high) >= SIDE_MIN_COUNTS)
        if not enough.any():
            options.append(np.full_like(cols["t"], np.nan))
            continue
        split = cv_errors(lambda w, c, b=below: (np.where(c["m"] <= b, refit(w * (c["m"] <= b), c),
                                                          refit(w * (c["m"] > b), c)),), cols, mask, fold)[0]
        options.append(np.where(enough[:, None], split, np.nan))
    return _final_regimes(keys, picks(options), switches, cols, mask, theta, tiled)


def _counts(cols: dict, weight: np.ndarray) -> np.ndarray:
    """Distinct token counts per shape among its rows of weight > 0."""
    return np.array([len(np.unique(m[w > 0])) for m, w in zip(cols["m"], weight)])


def _final_regimes(keys, chosen, switches, cols, mask, theta, tiled) -> dict[str, Regimes]:
    """The picked shapes' two regimes, each refitted on all its fit rows on its side of the switch."""
    out = {}
    for option in sorted(set(chosen.tolist()) - {0}):
        below, above = switches[option - 1]
        low = fit_batched(theta, cols, mask * (cols["m"] <= below), tiled)
        high = fit_batched(theta, cols, mask * (cols["m"] >= above), tiled)
        for s in np.flatnonzero(chosen == option):
            out[keys[s]] = Regimes(float(below), float(above), theta_coeffs(low[s], tiled[s]),
                                   theta_coeffs(high[s], tiled[s]))
    return out
