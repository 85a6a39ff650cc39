"""Fit one family's roofline coefficients to measured kernel times.

Model: pred = max(F * s_per_flop * (1 + tile_rows / rows), B * s_per_byte) + overhead_s + seqs * s_per_seq
+ keys * s_per_key (+ side . SIDE_FIELDS, A * s_per_attention_flop and R * s_per_chunk_row where given), with F the FLOPs, B
the bytes, `rows` the rows of a tile (matmul m, prefill chunk), `seqs` the sequences of an attention launch
(each costs a work unit whatever its length), `keys` the keys of a causal launch's longest row (its
critical path, roofline.operator_keys), `side` the side terms of the L2 benchmark states
(shape_keys.side_terms), A the attention FLOPs of a module fitted whole (modern_fit's MLA) and R the rows
of a serial in-chunk loop (modern_fit's GDN prefill). The fit minimises the squared
*relative* error sum((pred - t) / t)^2. The max() makes it piecewise linear, so we alternate:
assign each sample to the compute or memory side under the current coefficients, solve the weighted
non-negative linear least-squares problem, repeat until the assignment stops changing, from several
starting thresholds on arithmetic intensity F/B. Families with no FLOPs (elementwise, all-reduce) are a
single solve. `robust` then reweights (IRLS, weights 1/sqrt|relative error|) towards least absolute
relative error, so a few odd kernels cannot drag the rest.
"""
from __future__ import annotations

import numpy as np

from .errors import ConfigError
from .roofline import SIDE_FIELDS, Coeffs

ROBUST_ROUNDS, ROBUST_FLOOR = 10, 0.005
_STARTS = 21


def predict_arrays(c: Coeffs, flops, nbytes, rows, seqs=None, keys=None, side=None, attention=None,
                   chunk_rows=None) -> np.ndarray:
    """Vectorised Coeffs.time over arrays (rows >= 1)."""
    compute = flops * c.s_per_flop * (1.0 + c.tile_rows / rows)
    t = np.where(flops > 0, np.maximum(compute, nbytes * c.s_per_byte), nbytes * c.s_per_byte) + c.overhead_s
    t = t if seqs is None else t + c.s_per_seq * seqs
    t = t if keys is None else t + c.s_per_key * keys
    t = t if attention is None else t + c.s_per_attention_flop * np.asarray(attention, dtype=float)
    t = t if chunk_rows is None else t + c.s_per_chunk_row * np.asarray(chunk_rows, dtype=float)
    return t if side is None else t + np.asarray(side, dtype=float) @ [getattr(c, f) for f in SIDE_FIELDS]


class _Problem:
    """The design columns of one family's samples; solve() fits a compute/memory assignment."""

    def __init__(self, flops, nbytes, seconds, rows, seqs, keys=None, side=None, attention=None, chunk_rows=None):
        self.f, self.b, self.t = (np.asarray(x, dtype=float) for x in (flops, nbytes, seconds))
        if len(self.t) < 2:
            raise ConfigError("profile", len(self.t), "need at least 2 measurements to fit a family")
        self.rows = np.ones_like(self.t) if rows is None else np.maximum(np.asarray(rows, dtype=float), 1.0)
        self.seqs = None if seqs is None else np.asarray(seqs, dtype=float)
        self.tiled = len(np.unique(self.rows)) > 1
        self.per_seq = self.seqs is not None and len(np.unique(self.seqs)) > 1
        self.keys = None if keys is None else np.asarray(keys, dtype=float)
        self.per_key = self.keys is not None and len(np.unique(self.keys)) > 1
        self.attention = None if attention is None else np.asarray(attention, dtype=float)
        self.chunk_rows = None if chunk_rows is None else np.asarray(chunk_rows, dtype=float)
        side = np.zeros((len(self.t), 0)) if side is None else np.asarray(side, dtype=float)
        self.side_cols = {f: side[:, j] for j, f in enumerate(SIDE_FIELDS[:side.shape[1]])
                          if len(np.unique(side[:, j])) > 1}
        self.w = 1.0 / self.t

    def solve(self, side: np.ndarray, g: np.ndarray) -> Coeffs:
        f, b, ones = self.f, self.b, np.ones_like(self.t)
        cols = {"flop": np.where(side, f, 0.0), "byte": np.where(side, 0.0, b), "one": ones}
        if self.tiled and f.any():
            cols["tile"] = np.where(side, f / self.rows, 0.0)
        if self.per_seq:
            cols["seq"] = self.seqs
        if self.per_key:
            cols["key"] = self.keys
        if self.attention is not None and self.attention.any():
            cols["attention"] = self.attention
        if self.chunk_rows is not None and len(np.unique(self.chunk_rows)) > 1:
            cols["chunk_row"] = self.chunk_rows
        cols.update(self.side_cols)
        if not f.any():
            del cols["flop"]
        sol = dict(zip(cols, _nnls_lite(np.column_stack(list(cols.values())) * (self.w * g)[:, None], g)))
        a = sol.get("flop", 0.0)
        return Coeffs(float(a), float(sol["byte"]), float(sol["one"]),
                      float(sol.get("tile", 0.0) / a) if a > 0 else 0.0, float(sol.get("seq", 0.0)),
                      float(sol.get("key", 0.0)), *(float(sol.get(f, 0.0)) for f in SIDE_FIELDS),
                      float(sol.get("attention", 0.0)), float(sol.get("chunk_row", 0.0)))

    def side(self, c: Coeffs) -> np.ndarray:
        return self.f * c.s_per_flop * (1.0 + c.tile_rows / self.rows) >= self.b * c.s_per_byte

    def relative(self, c: Coeffs) -> np.ndarray:
        side = sum(getattr(c, f) * col for f, col in self.side_cols.items())
        return (predict_arrays(c, self.f, self.b, self.rows, self.seqs, self.keys, attention=self.attention,
                               chunk_rows=self.chunk_rows)
                + side) * self.w - 1.0


def fit_family(flops, nbytes, seconds, rows=None, seqs=None, keys=None, max_iter: int = 50,
               robust: bool = True, side=None, attention=None, chunk_rows=None) -> Coeffs:
    """Coefficients of one family (see module docstring); `side`: (samples x SIDE_FIELDS) side terms;
    `attention`: FLOPs of a module's attention kernel, priced apart from `flops` (s_per_attention_flop);
    `chunk_rows`: rows of a serial in-chunk loop (s_per_chunk_row)."""
    p = _Problem(flops, nbytes, seconds, rows, seqs, keys, side, attention, chunk_rows)
    g = np.ones_like(p.t)
    if not p.f.any():
        c = p.solve(np.zeros_like(p.t, dtype=bool), g)
    else:
        c = _best_assignment(p, g, max_iter)
    if robust:
        for _ in range(ROBUST_ROUNDS):
            g = 1.0 / np.sqrt(np.maximum(np.abs(p.relative(c)), ROBUST_FLOOR))
            c = p.solve(p.side(c) if p.f.any() else np.zeros_like(p.t, dtype=bool), g)
    return c


#: Folds of the cross-validation that decides whether a GEMM shape's fit keeps its tile-rows term.
TILE_CV_FOLDS = 5
#: ... and drops it only where that lowers the cross-validated error by at least this share: a bias towards
#: the form whose shape coefficients transfer to other GPUs (the derived defaults).
TILE_CV_MARGIN = 0.1


def fit_tiled_or_not(flops, nbytes, seconds, rows) -> Coeffs:
    """One GEMM shape's coefficients, with the tile-rows term only where its own samples support it.

    The term (compute x (1 + tile_rows / m)) prices tiles that few rows fill poorly; on a coarse grid of
    token counts it can bend the fit to a few kernels' quirks. Both forms are scored by K-fold cross-
    validation over the distinct row counts of the samples given (every K-th one left out in turn; median
    |relative error|); the term is dropped only where that is TILE_CV_MARGIN better, and the chosen form
    is refitted on all of them. Only the samples given are used.
    """
    f, b, t, m = (np.asarray(x, dtype=float) for x in (flops, nbytes, seconds, rows))
    distinct = np.unique(m)
    if len(distinct) < 2 * TILE_CV_FOLDS:
        return fit_family(f, b, t, m)
    rank = np.searchsorted(distinct, m)
    scores = {}
    for tiled in (True, False):
        errors = []
        for fold in range(TILE_CV_FOLDS):
            out = rank % TILE_CV_FOLDS == fold
            c = fit_family(f[~out], b[~out], t[~out], m[~out] if tiled else None)
            errors.append(np.abs(predict_arrays(c, f[out], b[out], np.maximum(m[out], 1.0)) / t[out] - 1.0))
        scores[tiled] = float(np.median(np.concatenate(errors)))
    return fit_family(f, b, t, m if scores[False] >= (1 - TILE_CV_MARGIN) * scores[True] else None)


def _best_assignment(p: _Problem, g: np.ndarray, max_iter: int) -> Coeffs:
    """The compute/memory boundary is (nearly) a threshold on F/B: refine from several, keep the best."""
    intensity = p.f / np.maximum(p.b, 1e-300)
    best, best_loss = None, np.inf
    for threshold in [np.inf, *np.unique(np.quantile(intensity, np.linspace(0.0, 1.0, _STARTS)))]:
        side = intensity >= threshold
        for _ in range(max_iter):
            c = p.solve(side, g)
            new_side = p.side(c)
            if np.array_equal(new_side, side):
                break
            side = new_side
        loss = float(np.sum(p.relative(c) ** 2))
        if best is None or loss < best_loss * (1.0 - 1e-12):
            best, best_loss = c, loss
    return best


def _nnls_lite(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients by active-set elimination (few columns)."""
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)
    active = [j for j in range(a.shape[1]) if np.abs(a[:, j]).max() > 0]
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active] / scale[active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0.0
            x[active] = sol / scale[active]
            return x
        active.pop(int(np.argmin(sol)))
    return x
