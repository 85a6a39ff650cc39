"""Think times: how long a user waits before sending the next request."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels_cost_model.errors import require
from sim.core.fields import is_number


@dataclass(frozen=True, slots=True)
class ThinkTime:
    """Gamma-distributed delays with mean `mean_s` and coefficient of variation `cv`.

    cv=0: constant; cv=1: exponential (the usual user model); cv>1: bursty. mean_s=0: no delay.
    """

    mean_s: float = 0.0
    cv: float = 1.0

    def __post_init__(self) -> None:
        require(is_number(self.mean_s) and self.mean_s >= 0, "think_time.mean_s", self.mean_s,
                "must be finite and >= 0")
        require(is_number(self.cv) and self.cv >= 0, "think_time.cv", self.cv, "must be finite and >= 0")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.mean_s == 0 or self.cv == 0:
            return np.full(n, float(self.mean_s))
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, self.mean_s / shape, size=n)


def as_think_time(value) -> ThinkTime:
    """A ThinkTime from a number of seconds (exponential with that mean) or as is."""
    if isinstance(value, ThinkTime):
        return value
    require(is_number(value), "think_time", value, "must be a number of seconds or a ThinkTime")
    return ThinkTime(float(value))
