"""Hypothesis strategies for property-testing stop logic against scripted token streams.

Needs hypothesis, which ships with the dev extra (`pip install "servesim[dev]"`); the simulator
itself does not import this module.

Streams use the default byte tokenizer (`sim.core.text`): ids 0-255 are latin-1 characters and
`BYTE_EOS_TOKEN_ID` (256) is EOS with no text, so a stream of ids reads as a string.
`stop_scenarios()` is the one to start from: it places EOS, a stop token id or a stop string at a
chosen output position, biased towards the boundaries that matter (exactly `min_tokens`,
`min_tokens + 1`, exactly `max_tokens`, the `max_model_len` cap), and pads with filler that may
itself contain stoppers::

    from hypothesis import given
    from workloads.strategies import stop_scenarios

    @given(stop_scenarios())
    def test_my_stop_logic(scenario):
        result = my_engine(scenario.token_ids, scenario.params, scenario.eos_token_id, ...)
        assert len(result.output_token_ids) <= scenario.params.max_tokens
"""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from sim.core.sampling_params import SamplingParams
from sim.core.text import BYTE_EOS_TOKEN_ID

ALPHABET = "abcd."
"""Default characters of scripted text: few enough that stop strings also occur by chance."""

STOPPER_KINDS = ("eos", "stop_token_id", "stop_string", "none")


def token_ids_of(text: str) -> list[int]:
    """Byte-tokenizer ids of `text` (one token per character)."""
    return [ord(char) for char in text]


def text_token_ids(alphabet: str = ALPHABET, *, with_eos: bool = True, min_size: int = 0,
                   max_size: int = 24) -> st.SearchStrategy[list[int]]:
    """Streams of character ids from `alphabet`, with EOS sprinkled in when `with_eos`."""
    ids = token_ids_of(alphabet) + ([BYTE_EOS_TOKEN_ID] if with_eos else [])
    return st.lists(st.sampled_from(ids), min_size=min_size, max_size=max_size)


@st.composite
def stop_strings(draw, alphabet: str = ALPHABET, *, min_count: int = 0, max_count: int = 3,
                 max_len: int = 3) -> tuple[str, ...]:
    """Tuples of distinct non-empty stop strings over `alphabet`.

    Often one is a suffix of another, so that two complete on the same character (a tie).
    """
    word = st.text(alphabet, min_size=1, max_size=max_len)
    words = draw(st.lists(word, min_size=min_count, max_size=max_count, unique=True))
    if words and len(words) < max_count and draw(st.booleans()):
        suffix = words[0][draw(st.integers(0, len(words[0]) - 1)):]
        if suffix not in words:
            words.insert(draw(st.integers(0, len(words))), suffix)
    return tuple(words)


@st.composite
def sampling_params(draw, *, max_max_tokens: int = 12, alphabet: str = ALPHABET,
                    allow_stop: bool = True, need_stop_ids: bool = False,
                    need_stop_strings: bool = False) -> SamplingParams:
    """Valid SamplingParams with small caps; stop ids and strings drawn over `alphabet`.

    `need_stop_ids` / `need_stop_strings` guarantee at least one of each (they imply `allow_stop`).
    """
    max_tokens = draw(st.integers(1, max_max_tokens))
    min_tokens = draw(st.one_of(st.just(0), st.integers(0, max_tokens)))
    stop_ids, stop = (), ()
    if allow_stop or need_stop_ids or need_stop_strings:
        candidate_ids = token_ids_of(alphabet) + [BYTE_EOS_TOKEN_ID]
        stop_ids = tuple(draw(st.lists(st.sampled_from(candidate_ids), min_size=int(need_stop_ids),
                                       max_size=2, unique=True)))
        stop = draw(stop_strings(alphabet, min_count=int(need_stop_strings)))
    return SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens,
                          ignore_eos=draw(st.booleans()), stop_token_ids=stop_ids, stop=stop,
                          include_stop_str_in_output=draw(st.booleans()))


@dataclass(frozen=True)
class StopScenario:
    """One scripted request: its stream, params and limits, and where a stopper was planted.

    `stopper_at` is the 1-based output count at which the planted stopper's last token lands
    (None for kind "none"). The filler around it may contain further stoppers by chance.
    """

    token_ids: tuple[int, ...]
    params: SamplingParams
    eos_token_id: int
    prompt_len: int
    max_model_len: int | None
    stopper_kind: str
    stopper_at: int | None


def _boundary_positions(params: SamplingParams, cap: int) -> list[int]:
    """Output counts where stop rules change their mind, clipped to >= 1."""
    marks = {params.min_tokens, params.min_tokens + 1, params.max_tokens, params.max_tokens + 1,
             cap, cap + 1}
    return sorted(mark for mark in marks if mark >= 1)


def _positions(params: SamplingParams, cap: int, at: str | None) -> st.SearchStrategy[int]:
    """Where to plant the stopper (1-based output count)."""
    if at is not None:
        pinned = {"min_tokens": params.min_tokens, "max_tokens": params.max_tokens, "cap": cap}[at]
        return st.just(max(1, pinned))
    return (st.sampled_from(_boundary_positions(params, cap))
            | st.integers(1, params.max_tokens + 1))


def _plant(tokens: list[int], end: int, piece: list[int], filler: int) -> list[int]:
    """`tokens` (padded with `filler`) with `piece` written so its last token is output `end`."""
    start = max(0, end - len(piece))
    piece = piece[len(piece) - (end - start):]
    padded = tokens + [filler] * max(0, end - len(tokens))
    return padded[:start] + piece + padded[end:]


@st.composite
def stop_scenarios(draw, *, alphabet: str = ALPHABET, max_max_tokens: int = 12,
                   kinds: tuple[str, ...] = STOPPER_KINDS, at: str | None = None) -> StopScenario:
    """A stream with EOS, a stop token id or a stop string placed at a (often boundary) position.

    `at` pins the position: "min_tokens", "max_tokens" or "cap" (where a length rule fires:
    `min(max_tokens, max_model_len - prompt_len)`); by default boundaries are favoured.
    """
    kind = draw(st.sampled_from(kinds))
    params = draw(sampling_params(max_max_tokens=max_max_tokens, alphabet=alphabet,
                                  need_stop_ids=kind == "stop_token_id",
                                  need_stop_strings=kind == "stop_string"))
    prompt_len = draw(st.integers(0, 6))
    max_model_len = draw(st.none() | st.integers(prompt_len + 1, prompt_len + max_max_tokens + 2))
    cap = params.max_tokens if max_model_len is None else min(params.max_tokens,
                                                             max_model_len - prompt_len)
    length = draw(st.integers(0, params.max_tokens + 2))
    tokens = draw(text_token_ids(alphabet, min_size=length, max_size=length))
    piece = _stopper_piece(draw, kind, params)
    if piece is None:
        return StopScenario(tuple(tokens), params, BYTE_EOS_TOKEN_ID, prompt_len, max_model_len,
                            "none", None)
    position = draw(_positions(params, cap, at))
    tokens = _plant(tokens, position, piece, ord(alphabet[0]))
    return StopScenario(tuple(tokens), params, BYTE_EOS_TOKEN_ID, prompt_len, max_model_len,
                        kind, position)


def _stopper_piece(draw, kind: str, params: SamplingParams) -> list[int] | None:
    """Token ids of one stopper of `kind`, or None when there is none to plant."""
    if kind == "eos":
        return [BYTE_EOS_TOKEN_ID]
    if kind == "stop_token_id":
        return [draw(st.sampled_from(params.stop_token_ids))]
    if kind == "stop_string":
        return token_ids_of(draw(st.sampled_from(params.stop)))
    return None


@dataclass(frozen=True)
class WordStream:
    """A stream over a made-up vocabulary whose tokens carry several characters each.

    Pass `token_text` to `sim.run_until_stop(..., token_text=...)`. EOS has visible text, as
    `</s>` does in tokenizers that do not skip special tokens.
    """

    token_ids: tuple[int, ...]
    token_text: dict[int, str]
    eos_token_id: int


@st.composite
def word_streams(draw, alphabet: str = ALPHABET, *, max_words: int = 6, max_word_len: int = 4,
                 max_size: int = 16, eos_text: str = "</s>") -> WordStream:
    """Streams where one token may complete several stop strings, or end one mid-token."""
    words = draw(st.lists(st.text(alphabet, max_size=max_word_len), min_size=1,
                          max_size=max_words))
    token_text = dict(enumerate(words))
    eos_token_id = len(words)
    token_text[eos_token_id] = eos_text
    tokens = draw(st.lists(st.integers(0, eos_token_id), max_size=max_size))
    return WordStream(tuple(tokens), token_text, eos_token_id)
