"""Output text and stop-string matching, as vLLM's incremental detokenizer does it."""
from __future__ import annotations

from collections.abc import Callable, Mapping

from kernels_cost_model.errors import require

BYTE_EOS_TOKEN_ID = 256
"""EOS of the default byte tokenizer: ids 0-255 are bytes, 256 is EOS (a special token, no text)."""
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def byte_token_text(token_id: int) -> str:
    """Text piece of the default detokenizer, defined for every token id >= 0.

    Ids 0-255 are bytes (latin-1: one character each), 256 is EOS (no text), and every larger id is
    a word of its own: a space and the id written in base 26 with letters (257 -> " a", 258 -> " b",
    283 -> " ba"), as a real vocabulary's word pieces read. Same id, same text, in any process.
    """
    if 0 <= token_id < 256:
        return chr(token_id)
    if token_id == BYTE_EOS_TOKEN_ID:
        return ""
    if token_id < 0:
        raise ValueError(f"token id {token_id} is negative; token ids are >= 0")
    n, letters = token_id - BYTE_EOS_TOKEN_ID - 1, []
    while True:
        n, digit = divmod(n, 26)
        letters.append(_LETTERS[digit])
        if n == 0:
            return " " + "".join(reversed(letters))


def as_token_text(token_text: Mapping[int, str] | Callable[[int], str] | None) -> Callable[[int], str]:
    """Normalise a dict or callable (or None for the byte tokenizer) to a callable."""
    if token_text is None:
        return byte_token_text
    if isinstance(token_text, Mapping):
        return lambda token_id: token_text.get(token_id, "")
    _require_kind(token_text)
    return token_text


def _require_kind(token_text) -> None:
    require(callable(token_text) or isinstance(token_text, Mapping), "token_text", token_text,
            "must be a dict of token id -> text or a callable(token_id) -> str")


def check_token_text(token_text) -> None:
    """`token_text`: None, a dict of token id -> str, or a callable returning the text of an id; else a
    ConfigError. Once per run, before it (a dict may hold a whole vocabulary: `as_token_text`, per
    request, checks only the kind); a callable's results are checked as it runs (`TextState`)."""
    if token_text is None:
        return
    _require_kind(token_text)
    if not isinstance(token_text, Mapping):
        return
    bad = next((k for k, v in token_text.items() if not isinstance(v, str)), None)
    require(bad is None, f"token_text[{bad!r}]", token_text.get(bad), "must be a str")


def find_stop_string(text: str, new_chars: int, stop: tuple[str, ...],
                     earliest: bool = True) -> tuple[str, int] | None:
    """The stop string that ends within the last `new_chars` characters of `text`, if any.

    Returns (stop string, start index of its match) or None. A match must end among the new
    characters (earlier ones were seen by an earlier check) but may start before them: a stop string
    straddling token boundaries. `earliest=True` (vLLM V1 today): the match completing earliest in
    the text wins, ties go to list order. `earliest=False` (V0, and V1 before vLLM PR #49391): the
    first string in list order that matches anywhere in the window wins.
    """
    if new_chars <= 0:
        return None
    best_end = len(text) + 1
    best: tuple[str, int] | None = None
    seen = len(text) - new_chars
    for candidate in stop:
        start = text.find(candidate, max(0, seen - len(candidate) + 1))
        if start == -1:
            continue
        if not earliest:
            return candidate, start
        if start + len(candidate) < best_end:
            best_end, best = start + len(candidate), (candidate, start)
    return best


class TextState:
    """A request's detokenized output text and its stop-string check.

    `strict_min_tokens`: stop strings are looked for only once the output has more than
    `min_tokens` tokens (vLLM V1); otherwise from `min_tokens` tokens on (vLLM V0).
    `earliest`: which of several matches wins (see `find_stop_string`).
    """

    __slots__ = ("text", "token_text", "stop", "include", "min_tokens", "strict_min_tokens",
                 "earliest")

    def __init__(self, token_text: Callable[[int], str], stop: tuple[str, ...], include: bool,
                 min_tokens: int, strict_min_tokens: bool = True, earliest: bool = True):
        self.text = ""
        self.token_text = token_text
        self.stop = stop
        self.include = include
        self.min_tokens = min_tokens
        self.strict_min_tokens = strict_min_tokens
        self.earliest = earliest

    def append(self, token_id: int, num_output_tokens: int, hide: bool, check: bool) -> str | None:
        """Add one token's text (unless `hide`) and return the stop string it completes, if any."""
        piece = "" if hide else self.token_text(token_id)
        if type(piece) is not str:
            require(False, f"token_text({token_id})", piece, "must return a str")
        self.text += piece
        if not (check and self.stop and self._past_floor(num_output_tokens)):
            return None
        found = find_stop_string(self.text, len(piece), self.stop, self.earliest)
        if found is None:
            return None
        stop_str, start = found
        end = start + len(stop_str) if self.include else start
        self.text = self.text[:end]
        return stop_str

    def search_step(self, text_before: str, token_ids: list[int], first: int, hide_last: bool) -> str | None:
        """Search the text one step of several tokens added once, as vLLM 0.19.1's detokenizer does
        (`StopProfile.keeps_tokens_after_stop_string`): `text_before` then the text of `token_ids` (output
        tokens `first`, `first` + 1, ...; the last one's hidden when `hide_last`), from the end of the last
        of them at or below the stop-string floor. The text is cut at the stop string found, and that
        string returned; None leaves the text as it was."""
        text, floor, last = text_before, len(text_before), len(token_ids) - 1
        for i, token_id in enumerate(token_ids):
            piece = "" if hide_last and i == last else self.token_text(token_id)
            if type(piece) is not str:
                require(False, f"token_text({token_id})", piece, "must return a str")
            text += piece
            if not self._past_floor(first + i):
                floor = len(text)
        if not (self.stop and self._past_floor(first + last)):
            return None
        found = find_stop_string(text, len(text) - floor, self.stop, self.earliest)
        if found is None:
            return None
        stop_str, start = found
        self.text = text[:start + len(stop_str) if self.include else start]
        return stop_str

    def _past_floor(self, num_output_tokens: int) -> bool:
        return strings_armed(num_output_tokens, self.min_tokens, self.strict_min_tokens)


def strings_armed(num_output_tokens: int, min_tokens: int, strict: bool) -> bool:
    """Stop strings are looked for on the `num_output_tokens`-th output token: beyond `min_tokens`
    outputs when `strict` (vLLM V1), from `min_tokens` on otherwise (V0)."""
    if strict:
        return num_output_tokens > min_tokens
    return num_output_tokens >= min_tokens
