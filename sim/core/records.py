"""Records of a run: per request and per step, kept as columns so they stay cheap to grow."""
from __future__ import annotations

import struct
from array import array
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from sim.core.token_runs import TokenRuns, TokenTimes

NAN = float("nan")


def _floats() -> array:
    return array("d")


def _doubles(values: list) -> array:
    """`array("d", values)`, built from one struct pack of the floats (native doubles, the array's
    own layout): the array's constructor parses each value in turn, ~2x the time for the few hundred
    token times a finished request hands over."""
    return array("d", struct.pack(f"{len(values)}d", *values))


def _ints() -> array:
    return array("b")


def _counts() -> array:
    return array("q")


@dataclass
class RequestRecords:
    """Per-request columns, indexed by the request's arrival index (times and token counts as typed
    arrays, 8 bytes a value; labels and reasons as lists)."""

    request_id: list = field(default_factory=list)
    tenant: list = field(default_factory=list)
    session_id: list = field(default_factory=list)
    priority: list = field(default_factory=list)
    num_prompt_tokens: array = field(default_factory=_counts)
    #: the request's `max_tokens` (NaN where it set none)
    max_tokens: array = field(default_factory=_floats)
    arrival_time: array = field(default_factory=_floats)
    first_scheduled_time: array = field(default_factory=_floats)
    first_token_time: array = field(default_factory=_floats)
    finish_time: array = field(default_factory=_floats)
    num_output_tokens: array = field(default_factory=_counts)
    num_preemptions: array = field(default_factory=_counts)
    num_cached_tokens: array = field(default_factory=_counts)
    finish_reason: list = field(default_factory=list)
    stop_reason: list = field(default_factory=list)
    rejected: list = field(default_factory=list)
    token_times: list = field(default_factory=list)
    #: Finished requests' token times as runs (`record_token_times = "runs"`), else None.
    token_runs: TokenRuns | None = None

    def add(self, spec, request_id: str, arrival: float, record_token_times: bool | str) -> int:
        """Start the columns of a new request; returns its index."""
        self.request_id.append(request_id)
        self.tenant.append(spec.tenant)
        self.session_id.append(spec.session_id)
        self.priority.append(spec.priority)
        self.num_prompt_tokens.append(spec.num_prompt_tokens)
        max_tokens = spec.sampling_params.max_tokens
        self.max_tokens.append(NAN if max_tokens is None else max_tokens)
        self.arrival_time.append(arrival)
        for column in (self.first_scheduled_time, self.first_token_time, self.finish_time):
            column.append(NAN)
        for column in (self.num_output_tokens, self.num_preemptions, self.num_cached_tokens):
            column.append(0)
        self.finish_reason.append(None)
        self.stop_reason.append(None)
        self.rejected.append(False)
        self.token_times.append([] if record_token_times else None)  # (an array once it finished)
        if self.token_runs is not None:
            self.token_runs.add_request()
        return len(self.request_id) - 1

    def compact_token_times(self, index: int) -> None:
        """Request `index` finished: its token times become an `array('d')`, then runs (when kept as
        runs). While it runs they grow in a list: appending a float to a list costs a fraction of
        appending it to an array, which parses its argument each time."""
        times = self.token_times[index]
        if type(times) is list:
            self.token_times[index] = _doubles(times)
        if self.token_runs is not None:
            self.token_runs.finish(index, self.token_times)

    def times(self):
        """Every request's token times (`array('d')` or None each), wherever they are kept."""
        token_times = self.token_times
        for index, times in enumerate(token_times):
            if type(times) is list:  # (a request still running when the run ended)
                token_times[index] = _doubles(times)
        if self.token_runs is None:
            return token_times
        self.token_runs.compact(self.token_times)
        return TokenTimes(self.token_times, self.token_runs)

    def __len__(self) -> int:
        return len(self.request_id)

    def columns(self) -> dict[str, list]:
        """Every column but the token times, by name."""
        return {k: v for k, v in vars(self).items() if k not in ("token_times", "token_runs")}


#: Integer column types, narrowest first: a column widens to the next when a value does not fit.
_WIDER = {"b": "h", "h": "i", "i": "q"}


@dataclass
class StepRecords:
    """Per-step columns, kept as typed arrays: a run's steps can number millions.

    Times are 8-byte floats; counts start as 1-byte integers and a column widens (to 2, 4, then 8
    bytes) the first time a value does not fit, so a long run's records take ~30 bytes a step, not ~100.
    Rows are added through `append_row` / `extend_rows`, which do the widening.
    """

    start_time: array = field(default_factory=_floats)
    duration: array = field(default_factory=_floats)
    num_prefill_tokens: array = field(default_factory=_ints)
    num_decode_tokens: array = field(default_factory=_ints)
    batch_size: array = field(default_factory=_ints)
    num_sampled: array = field(default_factory=_ints)
    num_preempted: array = field(default_factory=_ints)
    kv_blocks_used: array = field(default_factory=_ints)
    kv_blocks_cached: array = field(default_factory=_ints)
    kv_blocks_free: array = field(default_factory=_ints)
    num_running: array = field(default_factory=_ints)
    num_waiting: array = field(default_factory=_ints)
    #: Columns a hook records, one value per step (speculative decoding: drafts and acceptances).
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.start_time)

    def columns(self) -> dict[str, list]:
        columns = {k: v for k, v in vars(self).items() if k != "extra"}
        columns.update(self.extra)
        return columns

    def append_row(self, row: tuple) -> None:
        """Add one step: a value per column, in the order of the fields."""
        size = len(self.start_time)
        try:  # (each column's append, looped in C: the deque of no length keeps nothing)
            deque(map(array.append, self._arrays(), row), 0)
        except OverflowError:
            self._widen_and_extend(size, [(value,) for value in row])

    def extend_rows(self, columns) -> None:
        """Add steps: a sequence of values per column, in the order of the fields (equal lengths)."""
        size = len(self.start_time)
        try:
            for column, values in zip(self._arrays(), columns):
                if type(values) is list:
                    column.fromlist(values)  # (about twice as fast as `extend` from a list)
                else:
                    column.extend(values)
        except OverflowError:
            self._widen_and_extend(size, columns)

    def _widen_and_extend(self, size: int, columns) -> None:
        """Drop what a failed addition left past `size`, widen the columns whose values do not fit,
        add the values."""
        for name, values in zip(_STEP_COLUMNS, columns):
            column = getattr(self, name)
            del column[size:]
            while column.typecode in _WIDER and not _fits(column.typecode, values):
                column = array(_WIDER[column.typecode], column)
            setattr(self, name, column)
            column.extend(values)

    def _arrays(self) -> list:
        return [self.start_time, self.duration, self.num_prefill_tokens, self.num_decode_tokens,
                self.batch_size, self.num_sampled, self.num_preempted, self.kv_blocks_used,
                self.kv_blocks_cached, self.kv_blocks_free, self.num_running, self.num_waiting]


_STEP_COLUMNS = [f for f in StepRecords.__dataclass_fields__ if f != "extra"]


def _fits(typecode: str, values) -> bool:
    limit = 1 << (8 * array(typecode).itemsize - 1)
    return all(-limit <= v < limit for v in values)


def as_numpy(column):
    """A typed column as numpy, integers widened to int64 (the width tables have always had; a copy;
    empty too, so that tables of an engine that saw no request keep their types); any other column as
    it is."""
    if not isinstance(column, array):
        return column
    values = np.frombuffer(column, dtype=column.typecode)
    return values.astype(np.int64) if values.dtype.kind == "i" else values.copy()


@dataclass
class RunRecords:
    """Everything one simulation recorded."""

    requests: RequestRecords
    steps: StepRecords
    num_gpu_blocks: int
    block_size: int
    end_time: float = 0.0
