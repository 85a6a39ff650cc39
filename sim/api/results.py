"""Results: per-request and per-step tables of a run, its summary, and save/load."""
from __future__ import annotations

import errno
import importlib.util
import json
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kernels_cost_model.errors import ConfigError, require
from sim.api.metrics import (METRIC_PERCENTILES, Summary, add_latency_columns, check_percentiles, kv_occupancy,
                             summarize)
from sim.api.slo import SLOConfig
from sim.api.spec_metrics import spec_decode_summary
from sim.api.step_table import StepTable
from sim.api.table_io import column_types, make_output_folder, read_table, write_table, write_text
from sim.api.version import __version__
from sim.core.records import RunRecords, as_numpy
from sim.core.token_runs import MergedTokenTimes


@dataclass
class Results:
    """What a simulation produced.

    requests: one row per request (times in simulated seconds, derived ttft_s/tpot_s/e2e_s/...).
    steps: one row per engine step (start, duration, tokens, batch, KV blocks, queue lengths); from a
        run, built on first read (the summary reads the step records in place).
    token_times: per request, every token's emission time (None where not recorded): a list, or from
        `simulate()` a read-only sequence over the times kept as runs (sim.core.token_runs.TokenTimes),
        each item read back as the same `array('d')`; merged runs (`merge_results`): a sequence over
        theirs (sim.core.token_runs.MergedTokenTimes).
    summary: the metrics of `sim.api.metrics.summarize`; `meta` holds config and provenance.
    """

    requests: pd.DataFrame
    steps: pd.DataFrame  # a property below: a DataFrame, or a StepTable built into one when read
    token_times: list
    summary: dict
    meta: dict = field(default_factory=dict)

    @classmethod
    def from_records(cls, records: RunRecords, slo: dict | None = None, meta: dict | None = None,
                     percentiles=METRIC_PERCENTILES) -> "Results":
        steps = StepTable(records.steps, records.num_gpu_blocks)
        kv = kv_occupancy(steps, records.num_gpu_blocks)  # before the request table: its float column is gone
        # as_numpy's arrays are fresh copies: the table takes them as they are (no second copy)
        columns = {k: as_numpy(v) for k, v in records.requests.columns().items()}
        columns["rejected"] = np.asarray(columns["rejected"], dtype=bool)  # (bool even with no request)
        # token ids (ints), stop strings or None, as vLLM's: never floats (ints and None alone would infer float64)
        columns["stop_reason"] = pd.Series(columns["stop_reason"], dtype=object)
        requests = pd.DataFrame(columns, copy=False)
        requests = add_latency_columns(requests)
        meta = dict(meta or {}, num_gpu_blocks=records.num_gpu_blocks, block_size=records.block_size,
                    end_time=records.end_time, slo=slo or {}, percentiles=list(percentiles))
        token_times = records.requests.times()
        summary = summarize(requests, steps, token_times, records.num_gpu_blocks, slo, percentiles, kv=kv)
        return cls(requests, steps, token_times, summary, meta)

    def with_slo(self, ttft_s: float | None = None, tpot_s: float | None = None,
                 e2e_s: float | None = None) -> "Results":
        """The same run summarised against other SLOs (checked as `SLOConfig` checks them)."""
        slo = SLOConfig(ttft_s=ttft_s, tpot_s=tpot_s, e2e_s=e2e_s).as_dict()
        return self._resummarized(slo, self.meta.get("percentiles", METRIC_PERCENTILES))

    def with_percentiles(self, percentiles) -> "Results":
        """The same run summarised with other percentiles beside mean, median and std: numbers in (0, 100),
        e.g. [50, 99.9]; a bare number (99) is a list of one."""
        return self._resummarized(self.meta.get("slo") or {}, check_percentiles(percentiles))

    def _resummarized(self, slo: dict, percentiles) -> "Results":
        summary = summarize(self.requests, self._steps, self.token_times, self.meta["num_gpu_blocks"], slo,
                            percentiles)
        meta = dict(self.meta, slo=slo, percentiles=list(percentiles))
        return Results(self.requests, self._steps, self.token_times, summary, meta)

    def with_client_latency(self, client) -> "Results":
        """The same run as an HTTP client times it (`sim.api.client.ClientConfig`); the steps, and so the
        engine's behaviour, are unchanged. Off (all zero) gives the run back as it is."""
        from sim.api.client import shift_requests, shift_token_times
        if client.is_off:
            return self
        requests = add_latency_columns(shift_requests(self.requests, client))
        token_times = shift_token_times(self.token_times, client)
        slo, percentiles = self.meta.get("slo") or {}, self.meta.get("percentiles", METRIC_PERCENTILES)
        summary = summarize(requests, self._steps, token_times, self.meta["num_gpu_blocks"], slo, percentiles)
        meta = dict(self.meta, client={"ttft_s": client.ttft_s, "per_token_s": client.per_token_s})
        return Results(requests, self._steps, token_times, summary, meta)

    def tokens(self) -> pd.DataFrame:
        """Long table of token emissions: request index, position, time."""
        rows = [(i, np.arange(len(t)), np.frombuffer(t, dtype=float))
                for i, t in enumerate(self.token_times) if t is not None and len(t)]
        if not rows:
            rows = [(0, np.arange(0), np.zeros(0))]
        return pd.DataFrame({"request_index": np.concatenate([np.full(len(p), i) for i, p, _ in rows]),
                             "position": np.concatenate([p for _, p, _ in rows]).astype(np.int64),
                             "time": np.concatenate([t for _, _, t in rows])})

    # ----- persistence ----------------------------------------------------------------------
    def save(self, directory: str | Path, fmt: str | None = None) -> Path:
        """Write requests/steps/tokens tables and summary.json into `directory`.

        fmt: "parquet" or "csv"; None (default) = Parquet when pyarrow is installed, else CSV.

        `load` gives back the same tables, column types included. summary.json is written last and
        marks the folder complete (an old one is removed first), so a save cut short by a signal
        never loads as a whole run; each file is written under a temporary name and renamed.
        """
        require_folder(directory)
        if fmt not in ("parquet", "csv", None):
            raise ConfigError("fmt", fmt, "must be 'parquet' or 'csv'")
        if fmt == "parquet" and not parquet_available():
            raise ConfigError("format", fmt, "Parquet needs pyarrow (pip install pyarrow); or use csv")
        fmt = fmt or ("parquet" if parquet_available() else "csv")
        out = make_output_folder(directory, "directory")
        (out / "summary.json").unlink(missing_ok=True)
        tables = {"requests": self.requests, "steps": self.steps, "tokens": self.tokens()}
        for name, table in tables.items():
            write_table(table, out / f"{name}.{fmt}", fmt)
        doc = {"servesim_version": __version__, "summary": summary_json(self.summary), "meta": self.meta, "format": fmt,
               "nonfinite": {k: repr(v) for k, v in self.summary.items() if _nonfinite(v)},
               "token_times_recorded": any(t is not None for t in self.token_times),
               "columns": {name: column_types(table) for name, table in tables.items()}}
        write_text(out / "summary.json", json.dumps(doc, indent=2, default=_jsonable, allow_nan=False))
        return out

    @classmethod
    def load(cls, directory: str | Path) -> "Results":
        """Read what `save` wrote."""
        require_folder(directory)
        src = Path(directory)
        summary_path = src / "summary.json"
        if not summary_path.exists():
            raise FileNotFoundError(f"{summary_path}: no summary.json; is this a servesim output folder?")
        doc = read_summary_json(summary_path)
        if "format" not in doc and "ratio" in (doc.get("meta") or {}):
            raise FileNotFoundError(f"{src}: a servesim disagg folder (its plots are in it already); plot and report"
                                    " read the folders of servesim run --out")
        fmt, types = doc.get("format", "parquet"), doc.get("columns", {})
        for name in ("requests", "steps", "tokens"):
            if not (src / f"{name}.{fmt}").exists():
                raise FileNotFoundError(errno.ENOENT, "file not found", str(src / f"{name}.{fmt}"))
        requests, steps, tokens = (read_table(src / f"{n}.{fmt}", fmt, types.get(n))
                                   for n in ("requests", "steps", "tokens"))
        summary = Summary({k: float(doc.get("nonfinite", {}).get(k, "nan")) if v is None else v
                           for k, v in doc["summary"].items()})
        token_times = _token_lists(tokens, len(requests), doc.get("token_times_recorded", False), src / f"tokens.{fmt}")
        meta = doc["meta"]
        if "completed" not in summary:  # saved before vLLM's names: summarise the tables again
            summary = summarize(requests, steps, token_times, meta["num_gpu_blocks"], meta.get("slo"))
        return cls(requests, steps, token_times, summary, meta)


def read_summary_json(path: Path) -> dict:
    """The document `Results.save` wrote to summary.json; a damaged one is a ConfigError naming the file."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError("summary.json", str(path), f"not a text file (byte {exc.start} is not UTF-8)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError("summary.json", str(path), f"not valid JSON (line {exc.lineno}, column {exc.colno});"
                          " not a servesim summary") from None
    ok = isinstance(doc, dict) and isinstance(doc.get("summary"), dict) and isinstance(doc.get("meta"), dict)
    if not ok:
        raise ConfigError("summary.json", str(path), "not a servesim summary (an object with 'summary' and"
                          " 'meta' objects)")
    return doc


def _get_steps(self) -> pd.DataFrame:
    if isinstance(self._steps, StepTable):
        self._steps = self._steps.frame()
    return self._steps


def _set_steps(self, steps) -> None:
    self._steps = steps


# After the class body, so the dataclass sees `steps` as a plain field; its __init__ goes through the setter.
Results.steps = property(_get_steps, _set_steps, doc="One row per engine step (built on first read).")


def parquet_available() -> bool:
    """Whether pandas can write Parquet here (pyarrow installed)."""
    return importlib.util.find_spec("pyarrow") is not None


def summary_json(summary: dict) -> dict:
    """The summary with NaN/inf (an empty statistic) as None, so the JSON is strict (null)."""
    return {k: None if isinstance(v, float) and not np.isfinite(v) else v for k, v in summary.items()}


def _token_lists(tokens: pd.DataFrame, n: int, recorded: bool, path: Path) -> list:
    """Each request's token times from the tokens table; a row of a request the requests table does not
    have (a damaged folder) is a ConfigError naming the file."""
    lists = [array("d") for _ in range(n)] if recorded else [None] * n
    for index, group in tokens.groupby("request_index", sort=True):
        require(0 <= int(index) < n, "tokens", str(path), f"has times of request_index {int(index)}, but the"
                f" requests table has {n} rows; the folder is damaged")
        lists[int(index)] = array("d", group.sort_values("position")["time"].to_numpy())
    return lists


def _nonfinite(value) -> bool:
    return isinstance(value, float) and not np.isfinite(value)


def _jsonable(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return str(value)


def require_folder(directory) -> None:
    """`directory` names a folder: a str or a path."""
    if not isinstance(directory, (str, Path)) or str(directory) == "":
        raise ConfigError("directory", directory, "must be a folder's path (str or pathlib.Path)")


def merge_results(parts: list[Results], slo: dict, meta: dict) -> Results:
    """Global Results of engines run side by side (cluster replicas, DP ranks): requests and steps of
    all of them (column `replica`), requests by arrival.

    KV occupancy in the global summary is the block-weighted mean of the replicas'; spec-decoding
    counters are summed over all their steps.
    """
    requests = pd.concat([p.requests.assign(replica=i) for i, p in enumerate(parts)], ignore_index=True)
    order = np.argsort(requests["arrival_time"].to_numpy(), kind="stable")
    requests = requests.iloc[order].reset_index(drop=True)
    tokens = MergedTokenTimes([p.token_times for p in parts], order)  # references, copies no times
    steps = pd.concat([p.steps.assign(replica=i) for i, p in enumerate(parts)], ignore_index=True)
    blocks = [p.meta["num_gpu_blocks"] for p in parts]
    summary = summarize(requests, steps.iloc[0:0], tokens, sum(blocks), slo)
    for key in ("kv_occupancy_mean", "kv_occupancy_peak", "kv_time_above_90pct"):
        summary[key] = float(np.average([p.summary[key] for p in parts], weights=blocks))
    summary.update(spec_decode_summary(steps, float(requests["num_output_tokens"].sum())))
    meta = dict(meta, num_gpu_blocks=sum(blocks), block_size=parts[0].meta["block_size"],
                end_time=max(p.meta["end_time"] for p in parts), slo=slo)
    return Results(requests, steps, tokens, summary, meta)
