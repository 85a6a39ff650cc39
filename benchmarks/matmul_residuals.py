"""Where a shipped calibration's matmul error lies (issue 14): its held-out residuals, sliced.

    python benchmarks/matmul_residuals.py [--profiles ../shared/data/kernel_profiles] [--gpu l40s]

For one GPU's AIConfigurator GEMM table (bf16, the rows the calibration reads), with the shipped
coefficients: the median |error| on the fit and the held-out split; per held-out token count m, the
median |error| and signed error (+: priced slower than measured); the held-out rows above and below the
datasheet ridge (FLOPs per byte of the roofline, bf16 peak / memory bandwidth); the spread of the
achieved rate of large GEMMs (m >= 2,048, n and k >= 4,096), in all and across k at one (m, n); and a
ceiling no form smooth in m can beat by much: each held-out row read off its own shape's measured
neighbouring token counts (log-log interpolation of the measured times, no model).

`--knee` also refits every shape with a smooth knee, time = (C^p + M^p)^(1/p) + overhead (C, M: the
roofline's compute and memory sides; p = inf is the shipped max), and prints the held-out median per p,
the 5-fold cross-validated median on the fit split (folds over its token counts) and the held-out error
of the p that cross-validation picks; and the small-batch table: per token count, the median over weights
of at least 4096 x 4096 of its time over the same weight's at 16 tokens. `--regimes` refits every shape as
two rooflines, below and above a switch token count, and prints the held-out median where each shape
splits only if its own cross-validation on the fit split prefers it (token counts next to the switch
read off one regime, or blended between both: the form the shipped calibrations now carry,
kernels_cost_model/matmul_regimes.py). The shipped fit's figures above include its regimes; the refits
start from its one-regime coefficients.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels_cost_model.aiconfigurator_tables import SYSTEMS, read_table  # noqa: E402
from kernels_cost_model.calibration import holdout_split, predict, shipped_calibration  # noqa: E402
from kernels_cost_model.hardware import get_gpu  # noqa: E402
from kernels_cost_model.matmul_regimes import PICK_MARGIN, fit_batched, picks, roofline_times, start_theta  # noqa: E402
from kernels_cost_model.shape_keys import matmul_key  # noqa: E402

SYSTEM_OF = {device: system for system, device in SYSTEMS.items()}


def residuals(profiles: Path, device: str) -> dict[str, dict[str, np.ndarray]]:
    """{"fit"|"held": {m, n, k, t (measured s), pred (s)}} of the device's GEMM table."""
    fit, held = holdout_split(list(read_table(profiles, SYSTEM_OF[device], "gemm")))
    cal = shipped_calibration(device)
    out = {}
    for name, rows in (("fit", fit), ("held", held)):
        cols = {c: np.array([r[c] for r in rows], dtype=float) for c in ("m", "n", "k")}
        out[name] = {**cols, "t": np.array([r["measured_s"] for r in rows]), "pred": predict(rows, cal)}
    return out


def neighbour_error(fit: dict, held: dict) -> np.ndarray:
    """|error| of each held-out row read off the measured times of its shape's fit rows (log-log in m)."""
    err = np.empty(len(held["t"]))
    for i in range(len(err)):
        same = (fit["n"] == held["n"][i]) & (fit["k"] == held["k"][i])
        order = np.argsort(fit["m"][same])
        lm, lt = np.log(fit["m"][same][order]), np.log(fit["t"][same][order])
        err[i] = abs(np.exp(np.interp(np.log(held["m"][i]), lm, lt)) / held["t"][i] - 1.0)
    return err


def rate_spread(rows: dict) -> tuple[np.ndarray, float]:
    """(achieved FLOP/s of the large GEMMs, std of log rate across k within one (m, n))."""
    big = (rows["m"] >= 2048) & (rows["n"] >= 4096) & (rows["k"] >= 4096)
    m, n = rows["m"][big], rows["n"][big]
    rate = 2.0 * m * n * rows["k"][big] / rows["t"][big]
    log_rate, dev = np.log(rate), np.empty(big.sum())
    for key in set(zip(m, n)):
        sel = (m == key[0]) & (n == key[1])
        dev[sel] = log_rate[sel] - np.median(log_rate[sel])
    return rate, float(np.std(dev))


def report(profiles: Path, device: str) -> dict[str, float]:
    res = residuals(profiles, device)
    fit, held = res["fit"], res["held"]
    signed = {s: r["pred"] / r["t"] - 1.0 for s, r in res.items()}
    gpu = get_gpu(device)
    out = {"fit": float(np.median(np.abs(signed["fit"]))), "held": float(np.median(np.abs(signed["held"])))}
    print(f"{device}: matmul median |error|, fit split {100 * out['fit']:.2f} %, held out {100 * out['held']:.2f} %"
          f" ({len(held['t'])} rows)")
    print(f"  {'m (held out)':>12s} {'rows':>5s} {'|error|':>8s} {'signed':>8s}")
    for m in np.unique(held["m"]):
        e = signed["held"][held["m"] == m]
        print(f"  {m:12.0f} {len(e):5d} {100 * np.median(np.abs(e)):7.2f}% {100 * np.median(e):+7.2f}%")
    intensity = held["m"] * held["n"] * held["k"] / (held["m"] * held["k"] + held["n"] * held["k"]
                                                     + held["m"] * held["n"])
    ridge = gpu.bf16_flops_per_s / gpu.hbm_bytes_per_s
    for label, sel in (("above", intensity > ridge), ("below", intensity <= ridge)):
        out[f"{label}_ridge"] = float(np.median(np.abs(signed["held"][sel])))
        print(f"  {label} the ridge ({ridge:.0f} FLOP/B): {sel.sum()} rows, {100 * out[f'{label}_ridge']:.2f} %")
    out["neighbours"] = float(np.median(neighbour_error(fit, held)))
    print(f"  held-out rows read off their shape's measured neighbours in m: {100 * out['neighbours']:.2f} %")
    rate, spread = rate_spread({c: np.concatenate([fit[c], held[c]]) for c in ("m", "n", "k", "t")})
    p10, p50, p90 = np.percentile(rate, [10, 50, 90]) / 1e12
    out["spread"] = spread
    print(f"  large GEMMs ({len(rate)}): {p10:.0f} / {p50:.0f} / {p90:.0f} TFLOP/s at p10 / median / p90 "
          f"(datasheet bf16 {gpu.bf16_flops_per_s / 1e12:.0f}); across k at one (m, n): std of log rate {spread:.3f}")
    return out


KNEES = (np.inf, 2.0, 3.0, 4.0, 6.0)
"""The knee exponents `--knee` compares (inf: the sharp max that ships)."""


def _padded(res: dict, keys: list) -> tuple[dict, np.ndarray]:
    """Padded (shape x row) columns of one split's rows, and the mask of real rows."""
    index = {key: np.flatnonzero((res["n"] == key[0]) & (res["k"] == key[1])) for key in keys}
    width = max(len(i) for i in index.values())
    cols = {c: np.ones((len(keys), width)) for c in ("m", "F", "B", "t")}
    mask = np.zeros((len(keys), width))
    for s, key in enumerate(keys):
        i = index[key]
        m, n, k = res["m"][i], key[0], key[1]
        cols["m"][s, :len(i)], cols["t"][s, :len(i)], mask[s, :len(i)] = m, res["t"][i], 1.0
        cols["F"][s, :len(i)], cols["B"][s, :len(i)] = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
    return cols, mask


class Shapes:
    """One GPU's GEMM shapes (those with held-out rows and shipped coefficients) as padded (shape x row)
    columns of both splits, with the shipped coefficients as the starting point of every refit."""

    def __init__(self, profiles: Path, device: str):
        res, cal = residuals(profiles, device), shipped_calibration(device)
        keys = sorted(set(zip(res["held"]["n"], res["held"]["k"])) & set(zip(res["fit"]["n"], res["fit"]["k"])))
        keys = [key for key in keys if matmul_key(*key) in cal.coeffs]
        self.theta, self.tiled = start_theta([cal.coeffs[matmul_key(*key)] for key in keys])
        self.fit, self.fit_mask = _padded(res["fit"], keys)
        self.held, self.held_mask = _padded(res["held"], keys)
        self.ms = np.unique(self.fit["m"][self.fit_mask > 0])
        self.fold = np.searchsorted(self.ms, self.fit["m"]) % 5

    def refit(self, mask: np.ndarray, cols: dict, p: float = np.inf) -> np.ndarray:
        """Seconds of `cols` under each shape refitted on its fit rows where `mask` is 1."""
        return roofline_times(fit_batched(self.theta, self.fit, mask, self.tiled, p), cols, self.tiled, p)[0]

    def errors(self, predict) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per variant, (held-out |error|, 5-fold cross-validated |error| on the fit split), NaN off each
        split; `predict(mask, cols)` returns a tuple of predictions, variants that share their refits. The
        folds run over the fit split's token counts."""
        held = [np.where(self.held_mask > 0, np.abs(v / self.held["t"] - 1.0), np.nan)
                for v in predict(self.fit_mask, self.held)]
        cv = [np.full_like(self.fit["t"], np.nan) for _ in held]
        for fold in range(5):
            out = (self.fold == fold) & (self.fit_mask > 0)
            for c, v in zip(cv, predict(self.fit_mask * ~out, self.fit)):
                c[out] = np.abs(v / self.fit["t"] - 1.0)[out]
        return list(zip(held, cv))


def knee_report(profiles: Path, device: str) -> dict:
    """{"held": {p: median}, "cv": {p: median}, "picked": p, "per_shape": median} for the smooth knee."""
    shapes = Shapes(profiles, device)
    held_err, cv_err = zip(*(shapes.errors(lambda mask, cols, p=p: (shapes.refit(mask, cols, p),))[0]
                             for p in KNEES))
    out = {"held": {p: float(np.nanmedian(e)) for p, e in zip(KNEES, held_err)},
           "cv": {p: float(np.nanmedian(e)) for p, e in zip(KNEES, cv_err)}}
    out["picked"] = min(KNEES, key=lambda p: out["cv"][p])
    out["per_shape"] = per_shape_pick(held_err, cv_err)
    print(f"{device}: smooth knee, per p: held out " + ", ".join(f"{p:g} {100 * e:.2f} %" for p, e in out["held"].items())
          + "; cross-validated on the fit split " + ", ".join(f"{p:g} {100 * e:.2f} %" for p, e in out["cv"].items())
          + f"; picked p = {out['picked']:g}: held out {100 * out['held'][out['picked']]:.2f} %"
          + f"; picked per shape (a knee where it wins by {PICK_MARGIN:.0%}): {100 * out['per_shape']:.2f} %")
    return out


def regimes_report(profiles: Path, device: str) -> dict:
    """{"single": median, "step": median, "blend": median, "split": share of shapes} for two regimes per
    shape: below and above a switch between two neighbouring fit token counts (at least 4 of them on each
    side), each refitted on its own rows. A shape splits, at its best switch, only where its
    cross-validation prefers that by PICK_MARGIN. A token count between the two neighbours takes the regime
    on its side of their geometric mean ("step") or a log-log blend of both regimes ("blend"); the fit's
    own token counts, and so the cross-validation, are the same either way."""
    shapes = Shapes(profiles, device)
    ms = shapes.ms
    single = shapes.errors(lambda mask, cols: (shapes.refit(mask, cols),))[0]
    split = [shapes.errors(_two_regimes(shapes, ms[i - 1], ms[i])) for i in range(4, len(ms) - 3)]
    out = {"single": float(np.nanmedian(single[0]))}
    for j, rule in enumerate(("step", "blend")):
        held_err, cv_err = zip(single, *(variants[j] for variants in split))
        out[rule] = per_shape_pick(held_err, cv_err)
    out["split"] = float(np.mean(picks(list(cv_err)) > 0))
    print(f"{device}: two regimes per shape: held out {100 * out['single']:.2f} -> {100 * out['step']:.2f} % "
          f"(between the switch's neighbours blended: {100 * out['blend']:.2f} %; {100 * out['split']:.0f} % "
          "of shapes split)")
    return out


def _two_regimes(shapes: Shapes, below: float, above: float):
    """predict(mask, cols) -> (step, blend) of every shape split between fit token counts `below` and
    `above` (see regimes_report), both from the same two refits."""
    switch = float(np.sqrt(below * above))

    def predict(mask, cols):
        low = shapes.refit(mask * (shapes.fit["m"] < switch), cols)
        high = shapes.refit(mask * (shapes.fit["m"] >= switch), cols)
        w = np.clip(np.log(cols["m"] / below) / np.log(above / below), 0.0, 1.0)
        return np.where(cols["m"] < switch, low, high), np.exp((1.0 - w) * np.log(low) + w * np.log(high))
    return predict


def per_shape_pick(held_err, cv_err) -> float:
    """Held-out median when each shape takes the option its own cross-validation picks (picks); options
    are (shape x row) arrays, NaN off their split."""
    chosen = np.concatenate([held_err[j][s] for s, j in enumerate(picks(list(cv_err)))])
    return float(np.nanmedian(chosen))


def small_batch_ratios(profiles: Path, device: str) -> dict[float, float]:
    """{m: median over weights of at least 4096 x 4096 of t(m) / t(16)} for the grid's token counts below 16."""
    res = residuals(profiles, device)
    rows = {c: np.concatenate([res["fit"][c], res["held"][c]]) for c in ("m", "n", "k", "t")}
    times = {(n, k, m): t for m, n, k, t in zip(rows["m"], rows["n"], rows["k"], rows["t"]) if n * k >= 4096 * 4096}
    out = {}
    for m in np.unique(rows["m"][rows["m"] <= 16]):
        ratios = [t / times[(n, k, 16.0)] for (n, k, mm), t in times.items() if mm == m and (n, k, 16.0) in times]
        out[float(m)] = float(np.median(ratios))
    print(f"{device}: t(m) / t(16), weights >= 4096 x 4096: " + ", ".join(f"{m:g} {r:.2f}" for m, r in out.items()))
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs_commands.py checks the docs' commands against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "kernel_profiles")
    parser.add_argument("--gpu", action="append", choices=sorted(SYSTEM_OF), help="default: l40s")
    parser.add_argument("--knee", action="store_true", help="also refit with a smooth knee; small-batch table")
    parser.add_argument("--regimes", action="store_true", help="also refit with two regimes in m per shape")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.profiles.is_dir():
        print(f"no kernel profiles at {args.profiles}")
        return 1
    for device in args.gpu or ["l40s"]:
        report(args.profiles, device)
        if args.knee:
            knee_report(args.profiles, device)
            small_batch_ratios(args.profiles, device)
        if args.regimes:
            regimes_report(args.profiles, device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
