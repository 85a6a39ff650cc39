"""Token sources: where the engine reads a request's next sampled token from.

The simulator does not run a model; each request's output is a deterministic stream. A scripted
stream is given explicitly; a synthetic one emits filler ids and puts EOS at the natural length.
"""
from __future__ import annotations

FILLER_BASE_TOKEN_ID = 1000
FILLER_SPAN = 20000


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
    """A request's token stream as one cheap callable: position -> token id (the engine's hot path)."""
    scripted = spec.output_token_ids
    base = FILLER_BASE_TOKEN_ID
    offset = request_index * 7919

    if scripted is not None:
        n = len(scripted)
        return lambda p: scripted[p] if p < n else base + (offset + p * 104729) % FILLER_SPAN
    eos_position = -1 if spec.output_len is None else spec.output_len - 1
    return lambda p: eos_token_id if p == eos_position else base + (offset + p * 104729) % FILLER_SPAN
