"""Which last-token strategy is cheaper for this traffic? Runs a workload three times, same seed:
without hidden states, with hybrid extraction, with post-sampling prefill (see `sim.whatif.last_token`).

    from sim.whatif.last_token_whatif import compare_strategies
    from workloads.hidden_states import with_hidden_states
    cmp = compare_strategies(with_hidden_states(workload, 0.3), config, cost_model, seed=0)
    cmp.table()        # one row per strategy: step-time, memory and E2E overheads
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kernels_cost_model.errors import require
from sim.whatif.last_token import STRATEGIES, HiddenStatesCost, HiddenStatesStats, make_hook
from sim.api.metrics import add_latency_columns
from sim.core.config import EngineConfig
from sim.core.records import RunRecords
from sim.engine.simulation import run_engine

MIB = 2 ** 20


@dataclass(frozen=True)
class StrategyResult:
    """One strategy against the run without hidden states (deltas: this run minus that run).

    step_time_pct: mean step duration, % change. added_time_pct: seconds the strategy added to
        steps, as % of the baseline's total step time (the extra GPU work; total step time itself
        barely moves while the engine never idles, as steps absorb it by batching more).
    peak_extra_mib: the strategy's largest per-step device memory (hybrid: the extraction buffer;
        post-sampling prefill: the recompute's KV plus its rows).
    mean_e2e_delta_s / p99_e2e_delta_s: change of the mean / p99 E2E latency over all completed
        requests; asked_mean_e2e_delta_s: mean change over the requests that asked (paired by
        request; NaN when the two runs' requests differ, as closed-loop runs may).
    """

    strategy: str
    records: RunRecords
    stats: HiddenStatesStats
    num_steps: int
    step_time_pct: float
    added_time_pct: float
    peak_extra_mib: float
    mean_e2e_delta_s: float
    p99_e2e_delta_s: float
    asked_mean_e2e_delta_s: float

    def row(self) -> dict:
        """The figures as a flat dict (one table row)."""
        s = self.stats
        return {"strategy": self.strategy, "num_steps": self.num_steps,
                "step_time_pct": self.step_time_pct, "added_time_pct": self.added_time_pct,
                "peak_extra_mib": self.peak_extra_mib, "mean_e2e_delta_s": self.mean_e2e_delta_s,
                "p99_e2e_delta_s": self.p99_e2e_delta_s,
                "asked_mean_e2e_delta_s": self.asked_mean_e2e_delta_s,
                "requests_asked": len(s.asked), "rows_extracted": s.rows,
                "speculative_rows": s.speculative_rows, "wasted_rows": s.wasted_rows,
                "prefill_tokens": s.prefill_tokens, "extra_step_s": s.extra_s}


@dataclass(frozen=True)
class StrategyComparison:
    """The baseline run (no hidden states) and one `StrategyResult` per strategy."""

    baseline: RunRecords
    results: dict[str, StrategyResult]

    def table(self):
        """A pandas DataFrame, one row per strategy."""
        import pandas as pd
        return pd.DataFrame([r.row() for r in self.results.values()]).set_index("strategy")


def e2e_latencies(records: RunRecords) -> np.ndarray:
    """E2E latency (finish - arrival) per request; NaN where not completed (sim.api.metrics' rule)."""
    requests = add_latency_columns(pd.DataFrame(records.requests.columns()))
    return requests["e2e_s"].where(requests["completed"]).to_numpy(dtype=float)


def _mean_step(records: RunRecords) -> float:
    durations = records.steps.duration
    return sum(durations) / len(durations) if durations else 0.0


def _pct(new: float, old: float) -> float:
    return 100.0 * (new / old - 1.0) if old else float("nan")


def _delta(stat, run: np.ndarray, base: np.ndarray) -> float:
    if not (np.isfinite(run).any() and np.isfinite(base).any()):
        return float("nan")
    return float(stat(run) - stat(base))


def _p99(x: np.ndarray) -> float:
    return np.nanpercentile(x, 99)


def summarize(strategy: str, run: RunRecords, stats: HiddenStatesStats, base: RunRecords) -> StrategyResult:
    """A strategy's run against the baseline run."""
    e2e, e2e0 = e2e_latencies(run), e2e_latencies(base)
    asked = np.asarray(stats.asked, dtype=int)
    paired = run.requests.request_id == base.requests.request_id and asked.size
    return StrategyResult(
        strategy=strategy, records=run, stats=stats, num_steps=len(run.steps),
        step_time_pct=_pct(_mean_step(run), _mean_step(base)),
        added_time_pct=100.0 * stats.extra_s / sum(base.steps.duration) if len(base.steps) else float("nan"),
        peak_extra_mib=stats.peak_bytes / MIB,
        mean_e2e_delta_s=_delta(np.nanmean, e2e, e2e0),
        p99_e2e_delta_s=_delta(_p99, e2e, e2e0),
        asked_mean_e2e_delta_s=_delta(np.nanmean, e2e[asked], e2e0[asked]) if paired else float("nan"))


def compare_strategies(workload, config, cost_model, num_gpu_blocks: int | None = None, *,
                       seed: int = 0, cost: HiddenStatesCost | None = None, token_text=None,
                       strategies=tuple(STRATEGIES)) -> StrategyComparison:
    """Run `workload` without hidden states, then once per strategy ("hybrid",
    "post_sampling_prefill"), same config and seed; requests ask for hidden states through
    `RequestSpec.return_hidden_states` (e.g. `workloads.hidden_states.with_hidden_states`).
    Stop strings are found in the engine (`stop_string_detection="engine"`), on the step that stops.

    A list of specs works too. `cost`: the extraction's cost (`HiddenStatesCost`; sizes default
    to the cost model's ModelSpec).
    """
    require(isinstance(config, EngineConfig), "config", type(config).__name__,
            "must be an EngineConfig, the engine's settings alone (a SimulationConfig's is its .engine)")
    kwargs = dict(seed=seed, token_text=token_text)
    # the strategies act on the step a request stops in: stop strings are found with the token checks
    config = dataclasses.replace(config, stop_string_detection="engine")
    is_spec_list = not (hasattr(workload, "iter_requests") or hasattr(workload, "process"))
    specs = list(workload) if is_spec_list else workload  # runs three times
    base = run_engine(specs, config, cost_model, num_gpu_blocks, **kwargs)
    results = {}
    for name in strategies:
        hook = make_hook(name, cost)
        run = run_engine(specs, config, cost_model, num_gpu_blocks, hooks=[hook], **kwargs)
        results[name] = summarize(name, run, hook.stats, base)
    return StrategyComparison(base, results)
