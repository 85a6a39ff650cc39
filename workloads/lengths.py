"""Token-length distributions: `sample(rng, n) -> int64 array`, every value >= 1.

Single-column: Fixed, Uniform, Normal, LogNormal (both clipped), Zipf, Empirical.
Pairs (prompt, output): Independent, EmpiricalPairs (resamples rows, keeps their correlation),
and Copula (Gaussian copula of two marginals: the shape of the shipped presets).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernels_cost_model.errors import require, require_path
from sim.core.fields import is_int
from workloads.errors import TraceFormatError


def _check_bounds(low: int, high: int) -> None:
    require(is_int(low) and low >= 1, "low", low, "must be an integer >= 1")
    require(is_int(high) and high >= low, "high", high, f"must be an integer >= low={low}")


def _clip_round(x: np.ndarray, low: int, high: int) -> np.ndarray:
    return np.clip(np.rint(x), low, high).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Fixed:
    """Always `value` tokens."""

    value: int

    def __post_init__(self) -> None:
        require(is_int(self.value) and self.value >= 1, "value", self.value,
                "must be an integer >= 1")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integers uniform on [low, high] inclusive."""

    low: int
    high: int

    def __post_init__(self) -> None:
        _check_bounds(self.low, self.high)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Normal:
    """Normal(mean, std), rounded and clipped to [low, high]."""

    mean: float
    std: float
    low: int = 1
    high: int = 1 << 20

    def __post_init__(self) -> None:
        require(self.std >= 0 and math.isfinite(self.std), "std", self.std, "must be finite and >= 0")
        _check_bounds(self.low, self.high)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _clip_round(rng.normal(self.mean, self.std, size=n), self.low, self.high)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """exp(Normal(mu, sigma)), rounded and clipped to [low, high]."""

    mu: float
    sigma: float
    low: int = 1
    high: int = 1 << 20

    def __post_init__(self) -> None:
        require(self.sigma >= 0 and math.isfinite(self.sigma), "sigma", self.sigma,
                "must be finite and >= 0")
        _check_bounds(self.low, self.high)

    @classmethod
    def from_mean_cv(cls, mean: float, cv: float, low: int = 1, high: int = 1 << 20) -> "LogNormal":
        """The lognormal with this (unclipped) mean and coefficient of variation."""
        require(mean > 0, "mean", mean, "must be > 0")
        require(cv >= 0, "cv", cv, "must be >= 0")
        sigma = math.sqrt(math.log1p(cv * cv))
        return cls(math.log(mean) - sigma * sigma / 2, sigma, low, high)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.from_normal(rng.standard_normal(n))

    def from_normal(self, z: np.ndarray) -> np.ndarray:
        """Lengths for standard-normal scores `z` (the copula hook)."""
        return _clip_round(np.exp(self.mu + self.sigma * z), self.low, self.high)


@dataclass(frozen=True, slots=True)
class Zipf:
    """P(k) ∝ k^-a on k = low..high (heavy-tailed; a > 0)."""

    a: float
    low: int = 1
    high: int = 8192

    def __post_init__(self) -> None:
        require(self.a > 0 and math.isfinite(self.a), "a", self.a, "must be finite and > 0")
        _check_bounds(self.low, self.high)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        ks = np.arange(self.low, self.high + 1, dtype=np.float64)
        cdf = np.cumsum(ks ** -self.a)
        idx = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
        return (self.low + np.minimum(idx, ks.size - 1)).astype(np.int64)


@dataclass(frozen=True, slots=True, eq=False)
class Empirical:
    """Resamples the given lengths uniformly with replacement."""

    values: np.ndarray

    def __post_init__(self) -> None:
        v = np.asarray(self.values, dtype=np.int64)
        require(v.ndim == 1 and v.size >= 1, "values", v.size, "must be a non-empty 1-d array")
        require(bool(v.min() >= 1), "values", int(v.min()), "lengths must be >= 1")
        object.__setattr__(self, "values", v)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.values[rng.integers(0, self.values.size, size=n)]


@dataclass(frozen=True, slots=True)
class Independent:
    """A (prompt, output) pair drawn from two independent distributions."""

    prompt: object
    output: object

    def __post_init__(self) -> None:
        for name in ("prompt", "output"):
            value = getattr(self, name)
            require(hasattr(value, "sample") and not isinstance(value, PAIRS), name, value,
                    "must be a length distribution such as Fixed(128) or Uniform(100, 2000)")

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.prompt.sample(rng, n), self.output.sample(rng, n)


@dataclass(frozen=True, slots=True, eq=False)
class EmpiricalPairs:
    """Resamples (prompt, output) rows together, keeping their joint distribution."""

    prompt_lens: np.ndarray
    output_lens: np.ndarray

    def __post_init__(self) -> None:
        p, o = Empirical(self.prompt_lens).values, Empirical(self.output_lens).values
        require(p.size == o.size, "output_lens", o.size, f"must match prompt_lens size {p.size}")
        object.__setattr__(self, "prompt_lens", p)
        object.__setattr__(self, "output_lens", o)

    @classmethod
    def from_csv(cls, path: str | Path, prompt_column: str = "num_prefill_tokens",
                 output_column: str = "num_decode_tokens") -> "EmpiricalPairs":
        """Reads a lengths file (default: the vidur/etalon `*_stats_*.csv` columns)."""
        prompts, outputs = read_length_columns(path, prompt_column, output_column)
        return cls(prompts, outputs)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, self.prompt_lens.size, size=n)
        return self.prompt_lens[idx], self.output_lens[idx]


@dataclass(frozen=True, slots=True, eq=False)
class Quantile:
    """Inverse-CDF sampling from a quantile table: `values[i]` is the `probs[i]` quantile.

    Linear interpolation between knots; probs must run from 0 to 1 (min and max observed).
    """

    probs: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        p, v = np.asarray(self.probs, float), np.asarray(self.values, float)
        require(p.ndim == 1 and p.size >= 2 and p.size == v.size, "values", v.size,
                f"needs one value per prob ({p.size})")
        require(p[0] == 0 and p[-1] == 1 and bool(np.all(np.diff(p) > 0)), "probs", p.tolist(),
                "must increase strictly from 0 to 1")
        require(bool(np.all(np.diff(v) >= 0)) and v[0] >= 1, "values", v.tolist(),
                "must be non-decreasing and >= 1")
        object.__setattr__(self, "probs", p)
        object.__setattr__(self, "values", v)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self._at(rng.random(n))

    def from_normal(self, z: np.ndarray) -> np.ndarray:
        return self._at(normal_cdf(z))

    def _at(self, u: np.ndarray) -> np.ndarray:
        return np.rint(np.interp(u, self.probs, self.values)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Copula:
    """A (prompt, output) pair joined by a Gaussian copula: normal scores correlated by `rho`.

    Marginals must offer `from_normal(z)` (LogNormal, Quantile). The presets use this shape.
    """

    prompt: object
    output: object
    rho: float = 0.0

    def __post_init__(self) -> None:
        require(-1 <= self.rho <= 1, "rho", self.rho, "must be in [-1, 1]")
        for name in ("prompt", "output"):
            value = getattr(self, name)
            require(hasattr(value, "from_normal"), name, value, "must be a LogNormal or a Quantile")

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        z = rng.standard_normal((2, n))
        z2 = self.rho * z[0] + math.sqrt(1 - self.rho**2) * z[1]
        return self.prompt.from_normal(z[0]), self.output.from_normal(z2)


SINGLE_COLUMN = (Fixed, Uniform, Normal, LogNormal, Zipf, Empirical, Quantile)
"""Distributions of one length; a workload's `lengths` pairs two of them (PAIRS)."""
PAIRS = (Independent, EmpiricalPairs, Copula)


def normal_cdf(z: np.ndarray) -> np.ndarray:
    """Standard normal CDF (Abramowitz-Stegun 7.1.26 erf; abs error < 1e-7)."""
    x = np.abs(z) / math.sqrt(2)
    t = 1 / (1 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1 - poly * np.exp(-x * x)
    return 0.5 * (1 + np.sign(z) * erf)


def read_length_columns(path: str | Path, *columns: str) -> list[np.ndarray]:
    """Integer columns of a CSV file, each value checked to be >= 1 (errors name file and line)."""
    path = require_path("path", path, "a CSV file")
    cols: list[list[int]] = [[] for _ in columns]
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceFormatError(path, 1, f"missing column(s) {missing}; found {reader.fieldnames}")
        for row in reader:
            for col, name in zip(cols, columns):
                col.append(_length(row[name], path, reader.line_num, name))
    return [np.asarray(c, dtype=np.int64) for c in cols]


def _length(text: str, path: Path, line: int, name: str, minimum: int = 1) -> int:
    try:
        value = int(float(text))
    except (TypeError, ValueError):
        raise TraceFormatError(path, line, f"{name}={text!r} is not a number") from None
    if value < minimum:
        raise TraceFormatError(path, line, f"{name}={value} must be >= {minimum}")
    return value
