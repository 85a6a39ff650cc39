"""CUDA-graph padding: the token counts a vLLM V1 engine captures graphs for.

vLLM replays a captured CUDA graph for any batch of up to the largest capture size, padding the batch
to the next captured size (the padded rows run through every captured operator). Its default sizes
(vLLM `VllmConfig._set_cudagraph_sizes`, V1 engine, 0.10 onwards): 1, 2, 4, then multiples of 8 below
256, then multiples of 16 up to min(2 x max_num_seqs, 512). `enforce_eager` turns graphs off, and so
does a platform that serves without them by default (`EAGER_ARCHITECTURES`).
"""
from __future__ import annotations

from functools import lru_cache

from kernels_cost_model.errors import require

#: vLLM's cap on the largest default capture size.
MAX_CAPTURE_SIZE = 512
#: GPU architectures whose vLLM platform serves eagerly unless told otherwise, and why.
EAGER_ARCHITECTURES = {
    "xe2": "vLLM's XPU platform sets cudagraph_mode NONE unless VLLM_XPU_ENABLE_XPU_GRAPH=1, a mode it calls "
           "experimental and single-GPU only (vllm/platforms/xpu.py, check_and_update_config)",
}


def serves_with_graphs(gpu, enforce_eager: bool = False) -> bool:
    """Whether vLLM replays captured graphs on `gpu` (a catalog GPU): not with `enforce_eager`, nor on
    an `EAGER_ARCHITECTURES` platform."""
    return not enforce_eager and gpu.architecture not in EAGER_ARCHITECTURES


@lru_cache(maxsize=None)
def capture_sizes(max_num_seqs: int = 256) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes for an engine with `max_num_seqs`."""
    require(isinstance(max_num_seqs, int) and max_num_seqs >= 1, "max_num_seqs", max_num_seqs,
            "must be an integer >= 1")
    largest = min(2 * max_num_seqs, MAX_CAPTURE_SIZE)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    return tuple(s for s in sizes if s <= largest) or (1,)
