"""The batch shape a cost model prices: per scheduled request, new tokens and context."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True)
class BatchShape:
    """One engine step's work.

    num_new_tokens[i]: tokens request i computes this step (a prefill chunk, or 1 for a decode).
    num_context_tokens[i]: tokens already in its KV cache before the step (prefix-cache hits and
        earlier chunks included); attention for those new tokens reads context + new.
    num_sampled: requests that sample a token this step (LM-head rows; the catch-up rule).
    """

    num_new_tokens: list[int]
    num_context_tokens: list[int]
    num_sampled: int

    @property
    def num_reqs(self) -> int:
        return len(self.num_new_tokens)

    @property
    def total_new_tokens(self) -> int:
        return sum(self.num_new_tokens)


class CostModel(Protocol):
    """Anything that prices a step. Must be a pure function of the batch shape."""

    def step_time(self, batch: BatchShape) -> float:
        """Seconds the step takes (GPU forward + engine CPU overhead)."""
        ...
