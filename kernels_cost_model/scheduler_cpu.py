"""The engine's per-step CPU time, from our own measurement of vLLM's scheduler.

`benchmarks/measure_scheduler_cpu.py` drives vLLM's real V1 Scheduler (no GPU, a config-only model)
and times `schedule()` + `update_from_output()` per step by running batch size and scheduled tokens;
it writes `data/scheduler_cpu/vllm-<version>.json` with the vLLM version, CPU model, date, method,
every point and a least-squares fit `base + per_request x requests + per_token x tokens`. The cost
model's CPU term defaults to that fit for the newest release measured.

Not in the measurement: the model runner's input preparation, sampling, and the front end's
detokenising (they need a loaded model). The figures are this measuring machine's CPU; a serving
host's differs (faster cores: less). Scale with `deployment.cpu_per_request_s`, or fit it to your
own run with `servesim calibrate --from-run`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kernels_cost_model.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent / "data" / "scheduler_cpu"
#: The measurement the cost model's CPU term defaults to (vLLM 0.33, the "vllm" scheduler profile).
DEFAULT_FILE = "vllm-0.33.0.json"


@dataclass(frozen=True)
class SchedulerCpu:
    """A fitted per-step CPU time (s) and where it comes from."""

    base_s: float
    per_request_s: float
    per_token_s: float
    source: str

    def step_s(self, requests: int, tokens: int) -> float:
        return self.base_s + self.per_request_s * requests + self.per_token_s * tokens


def read_scheduler_cpu(path: str | Path) -> SchedulerCpu:
    """The fit of one measurement file (ConfigError naming the file on a malformed one)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        fit = data["fit"]
        figures = [float(fit[k]) * 1e-6 for k in ("base_us", "per_request_us", "per_token_us")]
        source = (f"measured: vLLM {data['vllm_version']} scheduler on {data['cpu_model']}, {data['date']} "
                  f"({path.name})")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError("scheduler_cpu", str(path), f"not a scheduler CPU measurement: {exc!r}") from None
    if any(f < 0 for f in figures):
        raise ConfigError("scheduler_cpu", str(path), "fit figures must be >= 0")
    return SchedulerCpu(*figures, source=source)


@lru_cache(maxsize=None)
def default_scheduler_cpu() -> SchedulerCpu:
    return read_scheduler_cpu(DATA_DIR / DEFAULT_FILE)
