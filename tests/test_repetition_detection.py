"""Repetition detection (vLLM V1's RepetitionDetectionParams): the pattern check, the stop it makes in
the engine, and the length rules that still bind first."""
from __future__ import annotations

import numpy as np
import pytest

from sim import SimulationConfig, simulate
from sim.core.sampling_params import SamplingParams
from sim.core.stop_rules import ends_in_repetition
from workloads.spec import RequestSpec


@pytest.mark.parametrize("tokens, params, expected", [
    ([1, 2, 1, 2, 1, 2], (2, 2, 3), True), ([1, 2, 1, 2], (2, 2, 3), False),
    ([9, 5, 5, 5], (1, 0, 3), True),        # size 0 means 1
    ([5, 5, 5, 6], (3, 1, 2), False), ([4, 6, 7, 6, 7], (3, 1, 2), True), ([1, 2, 3, 1, 2, 3], (2, 1, 2), False),
])
def test_a_pattern_repeated_min_count_times_at_the_end(tokens, params, expected):
    assert ends_in_repetition(tokens, *params) is expected


def _run(params: SamplingParams, outputs: tuple, prompt: int = 20, max_model_len: int = 256, mode: str = "fast"):
    config = SimulationConfig(engine={"max_model_len": max_model_len, "num_gpu_blocks": 64, "mode": mode},
                              deployment={"cost_model": "linear"})
    spec = RequestSpec(0.0, np.arange(prompt, dtype=np.int32) + 10, output_token_ids=outputs, sampling_params=params)
    return simulate(config, workload=[spec]).requests.iloc[0]


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_a_request_stops_on_the_token_that_completes_the_repetition(mode):
    outputs = (100, 101, 7, 7, 7, 8, 9, 10) + tuple(range(200, 240))
    row = _run(SamplingParams(max_tokens=40, ignore_eos=True, repetition_detection=(1, 1, 3)), outputs, mode=mode)
    assert (row.num_output_tokens, row.finish_reason, row.stop_reason) == (5, "repetition", "repetition_detected")
    late = _run(SamplingParams(max_tokens=40, ignore_eos=True, min_tokens=6, repetition_detection=(1, 1, 3)),
                outputs, mode=mode)
    assert (late.num_output_tokens, late.finish_reason) == (40, "length")   # armed after the repeat passed


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_the_length_rules_bind_where_min_tokens_lies_beyond_them(mode):
    """max_model_len leaves 6 outputs; min_tokens 10 once made the engine skip the length check up to
    10 outputs, and the request never finished."""
    params = SamplingParams(max_tokens=None, min_tokens=10, repetition_detection=(2, 1, 3))
    with pytest.warns(UserWarning, match="cut at engine.max_model_len"):
        row = _run(params, tuple(range(300, 400)), prompt=250, mode=mode)
    assert (row.num_output_tokens, row.finish_reason) == (6, "length")
