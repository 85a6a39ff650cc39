"""The per-step table is built lazily: the summary reads the step records in place and equals the
summary of the eagerly built table; the lazily built table equals the eager one."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.api.metrics import summarize
from sim.api.results import Results
from sim.api.step_table import StepTable
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.records import as_numpy
from sim.core.sampling_params import SamplingParams
from sim.engine.simulation import run_engine
from workloads.spec import RequestSpec


def _records(n: int = 60, blocks: int = 400):
    """A run long enough for count columns to widen past one byte (KV blocks in use > 127)."""
    specs = [RequestSpec(0.05 * i, np.arange(i, i + 200 + 7 * i),
                         sampling_params=SamplingParams(max_tokens=20 + i % 13, ignore_eos=True))
             for i in range(n)]
    return run_engine(specs, EngineConfig(num_gpu_blocks=blocks, max_model_len=2048), LinearCostModel())


def _eager_steps(records) -> pd.DataFrame:
    """The table as `Results.from_records` built it before it was lazy."""
    steps = pd.DataFrame({k: as_numpy(v) for k, v in records.steps.columns().items()})
    steps["kv_occupancy"] = steps["kv_blocks_used"] / records.num_gpu_blocks if len(steps) else []
    return steps


@pytest.fixture(scope="module")
def records():
    return _records()


def test_a_run_widens_some_step_column(records):
    assert any(c.typecode != "b" for c in records.steps.columns().values() if hasattr(c, "typecode"))


def test_lazily_built_steps_equal_the_eager_table(records):
    results = Results.from_records(records)
    pd.testing.assert_frame_equal(results.steps, _eager_steps(records), check_exact=True)
    assert all(results.steps[c].dtype in (np.int64, np.float64) for c in results.steps.columns)


def test_summary_does_not_build_the_steps_table(records):
    results = Results.from_records(records, slo={"ttft_s": 1.0})
    assert not results._steps.built
    results = results.with_slo(ttft_s=0.5).with_percentiles([50, 99.9])
    assert not results._steps.built


def test_summary_from_step_records_equals_the_eager_one(records):
    results = Results.from_records(records)
    eager = summarize(results.requests, _eager_steps(records), results.token_times, records.num_gpu_blocks,
                      None)
    assert results.summary.keys() == eager.keys()
    for key, value in eager.items():
        assert results.summary[key] == value or (np.isnan(value) and np.isnan(results.summary[key])), key


def test_step_table_reads_columns_without_a_copy(records):
    table = StepTable(records.steps, records.num_gpu_blocks)
    start = table["start_time"]
    assert not start.flags.owndata and np.array_equal(start, np.asarray(records.steps.start_time))
    assert table.columns[-1] == "kv_occupancy" and len(table) == len(records.steps)


def test_empty_run_has_an_empty_steps_table():
    records = _records(n=0)
    results = Results.from_records(records)
    assert results.steps.empty and StepTable(records.steps, 1).empty
