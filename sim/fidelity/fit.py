"""Two host figures fitted end to end, each on one run; every other run is held out for it.

Nothing shipped uses these fits: the default replay prices every run with measured kernels and
collectives only (`host.UNFITTED`). `python benchmarks/fidelity.py --fit` shows what fitting them would
give, for a user deciding whether to fit their own host (labelled as fitted wherever printed).

Kernels are priced from measured RTX PRO 6000 kernel profiles and collectives from a measured two-GPU
NCCL sweep, yet the runs take longer than those measurements add up to, in two ways (docs/fidelity.md):

1. `cpu_per_request_s`: engine time per scheduled request per step that stays on the critical path.
   Fitted on the single-GPU run (`CPU_FIT_RUN`), the only run without collectives.
2. `collective_scale`: serving collectives / the sweep (taken five months after the runs, on a host
   with ACS and IOMMU recorded off; the runs recorded neither). Fitted on the tensor-parallel run
   (`COLLECTIVE_FIT_RUN`) with figure 1 fixed.

The data-parallel MoE run is held out for both. Each fit is a grid search minimising the root mean
square of the goal's four relative errors (mean TTFT, TPOT, E2E, duration).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .host import UNFITTED, HostFit
from .real_runs import RealRun

CPU_FIT_RUN, COLLECTIVE_FIT_RUN = "Llama-3.1-8B", "Qwen3-32B"
CPU_GRID = tuple(float(x) * 1e-6 for x in range(0, 41, 2))          # 0-40 us per request
SCALE_GRID = tuple(float(x) for x in np.round(np.arange(1.0, 3.51, 0.1), 2))


def headline_rms(run: RealRun, host: HostFit) -> float:
    """Root mean square of the relative errors of the goal's four figures."""
    from .report import HEADLINE, compare_run
    agg = compare_run(run, host=host).aggregates.set_index("metric")
    return float(np.sqrt(np.mean([agg.loc[m, "rel_error"] ** 2 for m in HEADLINE])))


def grid_fit(run: RealRun, base: HostFit, field: str, grid) -> tuple[float, dict[float, float]]:
    """(best value of `field` on `run`, RMS error per grid value), other figures as in `base`."""
    errors = {v: headline_rms(run, dataclasses.replace(base, **{field: v})) for v in grid}
    return min(errors, key=errors.get), errors


def fit_host(runs: dict[str, RealRun], report=print) -> HostFit:
    """Both figures, in order: engine time on the TP1 run, then the collective scale on the TP2 run."""
    cpu, errors = grid_fit(runs[CPU_FIT_RUN], UNFITTED, "cpu_per_request_s", CPU_GRID)
    report(f"{CPU_FIT_RUN}: cpu_per_request_s = {cpu * 1e6:.0f} us (RMS {errors[cpu] * 100:.1f}%)")
    host = HostFit(cpu_per_request_s=cpu)
    scale, errors = grid_fit(runs[COLLECTIVE_FIT_RUN], host, "collective_scale", SCALE_GRID)
    report(f"{COLLECTIVE_FIT_RUN}: collective_scale = {scale} (RMS {errors[scale] * 100:.1f}%)")
    return dataclasses.replace(host, collective_scale=scale)
