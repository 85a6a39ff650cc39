"""Durations of consecutive pure-decode steps of one batch, as the cost model prices them one by one.

Step u (u = 0, 1, ...) of a stretch: every row computes 1 new token over a context of
`context[r] + u` tokens and samples. For the linear cost model the sum is done in closed form with
the same floating-point operations in the same order as `LinearCostModel.step_time` (bit-identical),
and likewise for the roofline model (`kernels_cost_model.decode_stretch`); any other cost model is
asked step by step.
"""
from __future__ import annotations

import numpy as np

from kernels_cost_model.batch import BatchShape
from kernels_cost_model.cost_model import RooflineCostModel
from kernels_cost_model.decode_stretch import roofline_decode_times
from sim.core.cost import LinearCostModel

NUMPY_FROM = 16  # price fewer steps than this in plain Python (numpy's fixed costs dominate)


def decode_step_times(cost_model, context: list[int], first: int, count: int) -> list[float]:
    """Durations of decode steps first .. first+count-1 of the stretch over `context` (one per row)."""
    rows = len(context)
    if type(cost_model) is LinearCostModel:
        m = cost_model
        total = sum(context) + rows  # context + new tokens at step 0
        fixed, per_context, sampled = m.fixed_s + m.per_new_token_s * rows, m.per_context_token_s, m.per_sampled_s * rows
        if count < NUMPY_FROM:  # (the same operations in the same order as numpy's below)
            return [fixed + per_context * float(total + rows * u) + sampled for u in range(first, first + count)]
        contexts = (total + rows * np.arange(first, first + count, dtype=np.int64)).astype(np.float64)
        return (fixed + per_context * contexts + sampled).tolist()
    if type(cost_model) is RooflineCostModel:
        times = roofline_decode_times(cost_model, rows, sum(context), max(context), first, count)
        if times is not None:
            return times
    ones = [1] * rows
    return [float(cost_model.step_time(BatchShape(ones, [c + u for c in context], rows)))
            for u in range(first, first + count)]
