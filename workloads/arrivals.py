"""Arrival processes: when requests arrive, as sorted float arrays of simulated seconds.

Every process answers `sample(rng, n, start_s=0.0)`: the next `n` arrival times after `start_s`.
Renewal processes (Poisson, gamma, constant) draw i.i.d. gaps; time-varying rates use thinning.
`arrival_times(process, rng, num_requests=..., duration_s=...)` picks a count or a time window.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kernels_cost_model.errors import require
from sim.core.fields import is_int, is_number
from workloads.traces import read_trace


#: Gamma arrivals' coefficients of variation kept (public traces' run from about 1 to 13).
GAMMA_CV = (1e-3, 1e3)


def _positive(field: str, value: float) -> None:
    require(is_number(value) and value > 0, field, value, "must be a finite number > 0")


def _numbers(field: str, values) -> np.ndarray:
    """`values` as a float array; a ConfigError unless it is a list of numbers (no strings or bools)."""
    items = list(values) if isinstance(values, (list, tuple, np.ndarray)) else None
    require(items is not None and all(is_int(v) or isinstance(v, (float, np.floating)) for v in items),
            field, values, "must be a list of numbers")
    return np.asarray(items, float)


@dataclass(frozen=True, slots=True)
class Poisson:
    """Exponential gaps with mean 1/rate (CV 1): independent clients."""

    rate: float

    def __post_init__(self) -> None:
        _positive("rate", self.rate)

    def sample(self, rng: np.random.Generator, n: int, start_s: float = 0.0) -> np.ndarray:
        return start_s + np.cumsum(rng.exponential(1.0 / self.rate, size=n))


@dataclass(frozen=True, slots=True)
class Gamma:
    """Gamma gaps with mean 1/rate and coefficient of variation `cv` (>1 bursty, <1 regular)."""

    rate: float
    cv: float = 1.0

    def __post_init__(self) -> None:
        _positive("rate", self.rate)
        _positive("cv", self.cv)
        require(GAMMA_CV[0] <= self.cv <= GAMMA_CV[1], "cv", self.cv,
                f"must be in [{GAMMA_CV[0]}, {GAMMA_CV[1]}] (the gaps' shape is 1 / cv^2; for evenly spaced"
                " arrivals give a SyntheticWorkload workloads.Constant(rate) as its arrivals, in Python)")

    def sample(self, rng: np.random.Generator, n: int, start_s: float = 0.0) -> np.ndarray:
        shape = 1.0 / self.cv**2
        return start_s + np.cumsum(rng.gamma(shape, 1.0 / (self.rate * shape), size=n))


@dataclass(frozen=True, slots=True)
class Constant:
    """Evenly spaced arrivals, one every 1/rate seconds (CV 0)."""

    rate: float

    def __post_init__(self) -> None:
        _positive("rate", self.rate)

    def sample(self, rng: np.random.Generator, n: int, start_s: float = 0.0) -> np.ndarray:
        return start_s + np.arange(1, n + 1, dtype=float) / self.rate


@dataclass(frozen=True, slots=True)
class TimeVarying:
    """A non-homogeneous Poisson process with rate `rate_fn(t)` <= `max_rate`, by thinning.

    `rate_fn` maps a float array of times to rates (vectorised). `horizon_s`: the rate is 0 from
    then on (count mode then fails instead of waiting forever). Use `piecewise` or `diurnal`.
    """

    rate_fn: Callable[[np.ndarray], np.ndarray]
    max_rate: float
    horizon_s: float | None = None

    def __post_init__(self) -> None:
        _positive("max_rate", self.max_rate)

    def sample(self, rng: np.random.Generator, n: int, start_s: float = 0.0) -> np.ndarray:
        out: list[np.ndarray] = []
        have, t = 0, start_s
        while have < n:
            require(self.horizon_s is None or t < self.horizon_s, "num_requests", n,
                    f"the rate is 0 after {self.horizon_s} s, reached with {have} arrivals; use duration_s")
            cand, t = self._thinned(rng, t, max(64, 2 * (n - have)))
            out.append(cand[: n - have])
            have += out[-1].size
        return np.concatenate(out) if out else np.empty(0)

    def until(self, rng: np.random.Generator, end_s: float, start_s: float = 0.0) -> np.ndarray:
        """All arrivals in (start_s, end_s)."""
        out, t = [], start_s
        while t < end_s:
            cand, t = self._thinned(rng, t, max(64, int(self.max_rate * (end_s - t) * 1.1)))
            out.append(cand[cand < end_s])
        return np.concatenate(out) if out else np.empty(0)

    def _thinned(self, rng: np.random.Generator, t: float, chunk: int) -> tuple[np.ndarray, float]:
        cand = t + np.cumsum(rng.exponential(1.0 / self.max_rate, size=chunk))
        return cand[rng.random(chunk) * self.max_rate < self.rate_fn(cand)], float(cand[-1])


def piecewise(breakpoints_s: Sequence[float], rates: Sequence[float],
              period_s: float | None = None) -> TimeVarying:
    """Rate `rates[i]` from `breakpoints_s[i]` until the next breakpoint (the last rate holds on).

    breakpoints_s must start at 0 and increase; with `period_s` the schedule repeats.
    """
    bps, rs = _numbers("breakpoints_s", breakpoints_s), _numbers("rates", rates)
    require(bps.ndim == 1 and bps.size >= 1 and bps.size == rs.size, "rates", list(rates),
            "needs one rate per breakpoint")
    require(bps[0] == 0 and bool(np.all(np.diff(bps) > 0)), "breakpoints_s", list(breakpoints_s),
            "must start at 0 and strictly increase")
    require(bool(np.all(rs >= 0)) and rs.max() > 0, "rates", list(rates),
            "must be >= 0 with at least one > 0")
    require(period_s is None or (is_number(period_s) and period_s > bps[-1]), "period_s", period_s,
            f"must exceed the last breakpoint {bps[-1]}")

    def rate_fn(t: np.ndarray) -> np.ndarray:
        tt = np.mod(t, period_s) if period_s else t
        return rs[np.searchsorted(bps, tt, side="right") - 1]

    horizon = float(bps[-1]) if period_s is None and rs[-1] == 0 else None
    return TimeVarying(rate_fn, float(rs.max()), horizon)


def diurnal(mean_rate: float, amplitude: float = 0.5, period_s: float = 86400.0,
            peak_s: float = 0.0) -> TimeVarying:
    """A sinusoidal day: rate = mean_rate * (1 + amplitude * cos(2π (t - peak_s) / period_s))."""
    _positive("mean_rate", mean_rate)
    _positive("period_s", period_s)
    require(is_number(amplitude) and 0 <= amplitude <= 1, "amplitude", amplitude, "must be in [0, 1]")
    require(is_number(peak_s), "peak_s", peak_s, "must be a number of seconds")

    def rate_fn(t: np.ndarray) -> np.ndarray:
        return mean_rate * (1 + amplitude * np.cos(2 * np.pi * (t - peak_s) / period_s))

    return TimeVarying(rate_fn, mean_rate * (1 + amplitude))


@dataclass(frozen=True, slots=True, eq=False)
class TraceTimes:
    """Replays given timestamps (seconds, non-decreasing), rebased to start at 0.

    `target_rate` rescales time so that N / (t_last - t_first) equals it.
    """

    timestamps_s: np.ndarray
    target_rate: float | None = None

    def __post_init__(self) -> None:
        ts = np.asarray(self.timestamps_s, dtype=float)
        require(ts.ndim == 1 and ts.size >= 1, "timestamps_s", ts.size, "must be a non-empty 1-d array")
        finite = np.isfinite(ts)
        require(bool(finite.all()), "timestamps_s", None if finite.all() else float(ts[~finite][0]),
                "must be finite numbers of seconds")
        bad = np.flatnonzero(np.diff(ts) < 0)
        require(bad.size == 0, f"timestamps_s[{bad[0] + 1 if bad.size else 0}]",
                ts[bad[0] + 1] if bad.size else None, "goes backwards")
        if self.target_rate is not None:
            _positive("target_rate", self.target_rate)
        object.__setattr__(self, "timestamps_s", ts)

    @classmethod
    def from_trace(cls, path, format: str | None = None, target_rate: float | None = None) -> "TraceTimes":
        """The arrival times of a trace file (e.g. Azure timestamps to pair with preset lengths)."""
        return cls(np.fromiter((row.arrival_s for row in read_trace(path, format)), dtype=float), target_rate)

    def sample(self, rng: np.random.Generator, n: int, start_s: float = 0.0) -> np.ndarray:
        ts = self.timestamps_s
        require(n <= ts.size, "num_requests", n, f"exceeds the {ts.size} trace timestamps")
        return start_s + self.times()[:n]

    def times(self) -> np.ndarray:
        """All timestamps, rebased to 0 and rescaled."""
        return rescale(self.timestamps_s - self.timestamps_s[0], self.target_rate)


def rescale(times_s: np.ndarray, target_rate: float | None) -> np.ndarray:
    """Scale times (starting at 0) so that N / span == target_rate; unchanged when None."""
    span = float(times_s[-1] - times_s[0]) if times_s.size else 0.0
    if target_rate is None or span <= 0:
        return times_s
    return times_s * (times_s.size / span) / target_rate


ArrivalProcess = Poisson | Gamma | Constant | TimeVarying | TraceTimes


def arrival_times(process, rng: np.random.Generator, num_requests: int | None = None,
                  duration_s: float | None = None) -> np.ndarray:
    """`num_requests` arrivals, or all arrivals in [0, duration_s) (exactly one of the two)."""
    require((num_requests is None) != (duration_s is None), "num_requests/duration_s",
            (num_requests, duration_s), "give exactly one")
    if num_requests is not None:
        require(isinstance(num_requests, int) and num_requests >= 0, "num_requests", num_requests,
                "must be an integer >= 0")
        return process.sample(rng, num_requests)
    _positive("duration_s", duration_s)
    if isinstance(process, TraceTimes):
        times = process.times()
        return times[times < duration_s]
    if isinstance(process, TimeVarying):
        return process.until(rng, duration_s)
    chunks, t, chunk = [], 0.0, 256
    while t < duration_s:
        times = process.sample(rng, chunk, start_s=t)
        chunks.append(times[times < duration_s])
        t = times[-1] if times.size else duration_s
        chunk *= 2
    return np.concatenate(chunks) if chunks else np.empty(0)
