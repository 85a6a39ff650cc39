"""Token sources: where the engine reads a request's next sampled token from.

The simulator does not run a model; each request's output is a deterministic stream. A scripted
stream is given explicitly; a synthetic one emits filler ids and puts EOS at the natural length.
"""
from __future__ import annotations

from functools import cache

import numpy as np

FILLER_BASE_TOKEN_ID = 1000
FILLER_SPAN = 20000
FILLER_RANGE = range(FILLER_BASE_TOKEN_ID, FILLER_BASE_TOKEN_ID + FILLER_SPAN)  # synthetic streams' filler ids


def filler_token(request_index: int, position: int) -> int:
    """A deterministic non-special token id for position `position` of a synthetic stream."""
    return FILLER_BASE_TOKEN_ID + (request_index * 7919 + position * 104729) % FILLER_SPAN


class TokenSource:
    """Reads token `position` (0-based) of a request's output stream.

    Scripted streams (spec.output_token_ids) are replayed as given; past their end the source keeps
    emitting filler so a request never starves (tests check stops happen before the end).
    Synthetic streams emit filler and EOS at position `output_len - 1`.
    """

    def __init__(self, eos_token_id: int):
        self.eos_token_id = eos_token_id

    def token_at(self, spec, request_index: int, position: int) -> int:
        scripted = spec.output_token_ids
        if scripted is not None:
            if position < len(scripted):
                return scripted[position]
            return filler_token(request_index, position)
        if spec.output_len is not None and position == spec.output_len - 1:
            return self.eos_token_id
        return filler_token(request_index, position)


def stream_for(spec, request_index: int, eos_token_id: int):
    """A request's token stream as one cheap callable: position -> token id (the engine's hot path).

    Its `span(start, stop)` gives positions start..stop-1 at once, as an int64 array. A synthetic
    stream also carries `synthetic` = (offset, EOS position, EOS id) for `synthetic_spans` (None when
    there is no EOS id)."""
    scripted = spec.output_token_ids
    base = FILLER_BASE_TOKEN_ID
    offset = request_index * 7919

    if scripted is not None:
        n = len(scripted)
        stream = lambda p: scripted[p] if p < n else base + (offset + p * 104729) % FILLER_SPAN  # noqa: E731
        stream.span = lambda start, stop: _scripted_span(scripted, offset, start, stop)
        stream.synthetic = None
        return stream
    eos_position = -1 if spec.output_len is None else spec.output_len - 1
    cycle, first = _filler_cycle(), offset * _INVERSE_STEP % FILLER_SPAN  # (`synthetic_rows`)
    stream = lambda p: eos_token_id if p == eos_position else cycle[(first + p) % FILLER_SPAN]  # noqa: E731
    stream.span = lambda start, stop: _synthetic_span(eos_token_id, eos_position, offset, start, stop)
    stream.synthetic = None if eos_token_id is None else (offset, eos_position, eos_token_id)
    return stream


def read_tokens(stream, start: int, stop: int) -> list[int]:
    """Positions start .. stop-1 of a stream as a list: a synthetic stream's as slices of its filler
    cycle (`synthetic_rows`), any other's one call per position."""
    synthetic = getattr(stream, "synthetic", None)
    if synthetic is not None:
        return synthetic_rows([synthetic], [start], stop - start)[0]
    return list(map(stream, range(start, stop)))


def natural_length(stream) -> int:
    """Outputs up to and including a synthetic stream's EOS (0: none known), where most requests stop."""
    synthetic = getattr(stream, "synthetic", None)
    return 0 if synthetic is None else synthetic[1] + 1


def synthetic_spans(params: list, starts: np.ndarray, count: int) -> np.ndarray:
    """Positions starts[r] .. starts[r]+count-1 of several synthetic streams at once (rows x count,
    int64): row r is the stream whose `synthetic` is params[r]."""
    offsets, eos_positions, eos_ids = (np.array(column, dtype=np.int64) for column in zip(*params))
    positions = starts[:, None] + np.arange(count, dtype=np.int64)
    tokens = FILLER_BASE_TOKEN_ID + (offsets[:, None] + positions * 104729) % FILLER_SPAN
    at_eos = positions == eos_positions[:, None]
    if at_eos.any():
        tokens[at_eos] = np.broadcast_to(eos_ids[:, None], tokens.shape)[at_eos]
    return tokens


def synthetic_rows(params: list, starts: list, count: int) -> list[list[int]]:
    """`synthetic_spans(params, starts, count).tolist()`, each row one slice of `_filler_cycle` (a
    stream's filler ids run through that cycle from a point of their own)."""
    if count > FILLER_SPAN:
        return synthetic_spans(params, np.array(starts, dtype=np.int64), count).tolist()
    cycle, rows = _filler_cycle(), []
    for (offset, eos_position, eos_id), start in zip(params, starts):
        first = (offset * _INVERSE_STEP + start) % FILLER_SPAN
        row = cycle[first:first + count]
        if start <= eos_position < start + count:
            row[eos_position - start] = eos_id
        rows.append(row)
    return rows


#: 104729's inverse mod FILLER_SPAN (they are coprime): the stream with offset o emits at position p the
#: id at cycle point (o x this + p) mod FILLER_SPAN, since (o x inverse + p) x 104729 = o + p x 104729
_INVERSE_STEP = pow(104729, -1, FILLER_SPAN)


@cache
def _filler_cycle() -> list[int]:
    """The filler ids of positions 0 .. 2 x FILLER_SPAN - 1 of the stream with offset 0: a full period
    twice, so any run of at most FILLER_SPAN positions of any stream is one slice."""
    return _filler_span(0, 0, 2 * FILLER_SPAN).tolist()


def _filler_span(offset: int, start: int, stop: int) -> np.ndarray:
    positions = np.arange(start, stop, dtype=np.int64)
    return FILLER_BASE_TOKEN_ID + (offset + positions * 104729) % FILLER_SPAN


def _synthetic_span(eos_token_id: int, eos_position: int, offset: int, start: int, stop: int) -> np.ndarray:
    tokens = _filler_span(offset, start, stop)
    if start <= eos_position < stop:
        tokens[eos_position - start] = eos_token_id
    return tokens


def _scripted_span(scripted, offset: int, start: int, stop: int) -> np.ndarray:
    tokens = _filler_span(offset, start, stop)
    end = min(stop, len(scripted))
    if start < end:
        tokens[:end - start] = scripted[start:end]
    return tokens
