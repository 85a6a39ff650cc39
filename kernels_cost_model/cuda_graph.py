"""CUDA-graph padding: the token counts a vLLM V1 engine captures graphs for.

vLLM replays a captured CUDA graph for any batch of up to the largest capture size, padding the batch
to the next captured size (the padded rows run through every captured operator). Its default sizes
(vLLM `VllmConfig._set_cudagraph_sizes`, V1 engine, 0.10 onwards): 1, 2, 4, then multiples of 8 below
256, then multiples of 16 up to min(2 x max_num_seqs, 512). `enforce_eager` turns graphs off.
"""
from __future__ import annotations

from functools import lru_cache

from kernels_cost_model.errors import require

#: vLLM's cap on the largest default capture size.
MAX_CAPTURE_SIZE = 512


@lru_cache(maxsize=None)
def capture_sizes(max_num_seqs: int = 256) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes for an engine with `max_num_seqs`."""
    require(isinstance(max_num_seqs, int) and max_num_seqs >= 1, "max_num_seqs", max_num_seqs,
            "must be an integer >= 1")
    largest = min(2 * max_num_seqs, MAX_CAPTURE_SIZE)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    return tuple(s for s in sizes if s <= largest) or (1,)
