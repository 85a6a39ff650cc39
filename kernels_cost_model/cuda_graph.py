"""CUDA-graph padding: the token counts a vLLM V1 engine captures graphs for.

vLLM replays a captured CUDA graph for any batch of up to the largest capture size, padding the batch
to the next captured size (the padded rows run through every captured operator). Its default sizes
(vLLM `VllmConfig._set_cudagraph_sizes`, V1 engine, 0.10 onwards): 1, 2, 4, then multiples of 8 below
256, then multiples of 16 up to min(2 x max_num_seqs, 512, max_num_batched_tokens). vLLM 0.33 raises the
512 to 1024 on data-centre Blackwell (compute capability 10.x) and also captures max_num_batched_tokens
and max_num_seqs themselves where they fit under that largest size. `--performance-mode interactivity`
captures every size from 1 to 32. `enforce_eager` turns graphs off, and so does a platform that serves
without them by default in the releases before 0.33 (`EAGER_ARCHITECTURES`).
"""
from __future__ import annotations

from functools import lru_cache

from kernels_cost_model.errors import require

#: vLLM's cap on the largest default capture size; vLLM 0.33's on data-centre Blackwell.
MAX_CAPTURE_SIZE = 512
BLACKWELL_DC_CAPTURE_SIZE = 1024
#: Releases (major.minor) with 0.33's rules: the Blackwell cap, budget and batch size captured themselves.
NEWER_CAPTURE_RULES = ("0.33",)
#: GPU architectures whose vLLM platform serves eagerly unless told otherwise, and why: up to 0.19 (0.19.1
#: read) and the releases between. vLLM 0.33's XPU platform captures graphs wherever its torch supports
#: XPU graphs, and drops the variable and the single-GPU rule (0.33.0 vllm/platforms/xpu.py).
EAGER_ARCHITECTURES = {
    "xe2": "vLLM's XPU platform sets cudagraph_mode NONE unless VLLM_XPU_ENABLE_XPU_GRAPH=1, a mode it calls "
           "experimental and single-GPU only (vllm/platforms/xpu.py, check_and_update_config)",
}


def serves_with_graphs(gpu, enforce_eager: bool = False, release: str = "0.19") -> bool:
    """Whether vLLM `release` (major.minor) replays captured graphs on `gpu` (a catalog GPU): not with
    `enforce_eager`, nor on an `EAGER_ARCHITECTURES` platform before 0.33's rules."""
    if enforce_eager:
        return False
    return release in NEWER_CAPTURE_RULES or gpu.architecture not in EAGER_ARCHITECTURES


@lru_cache(maxsize=None)
def capture_sizes(max_num_seqs: int = 256, max_num_batched_tokens: int | None = None, release: str = "0.19",
                  compute_capability: str = "", interactivity: bool = False,
                  num_speculative_tokens: int = 0) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes for an engine with `max_num_seqs` and `max_num_batched_tokens`
    (None: no cap) under vLLM `release` (major.minor) on a GPU of `compute_capability`; `interactivity`:
    vLLM's `--performance-mode interactivity` (every size up to 32). With `num_speculative_tokens` k a
    decode row is 1 + k tokens: the largest size is 2 x max_num_seqs x (1 + k) (capped as above), and
    0.33 also captures every uniform decode batch, n x (1 + k) tokens for n on the same grid of
    request counts (`VllmConfig._set_cudagraph_sizes`, vLLM 0.19.1 and 0.33.0)."""
    require(isinstance(max_num_seqs, int) and max_num_seqs >= 1, "max_num_seqs", max_num_seqs,
            "must be an integer >= 1")
    newer = release in NEWER_CAPTURE_RULES
    cap = BLACKWELL_DC_CAPTURE_SIZE if newer and compute_capability.startswith("10.") else MAX_CAPTURE_SIZE
    query = 1 + num_speculative_tokens
    largest = uncapped = min(2 * max_num_seqs * query, cap)
    if max_num_batched_tokens is not None:
        largest = min(largest, max_num_batched_tokens)
    sizes = {1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)}
    if interactivity:
        sizes.update(range(1, 33))
    if newer and max_num_batched_tokens is not None:
        sizes.add(max_num_batched_tokens)  # (kept below only where it fits under the largest)
        sizes.update(_uniform_decode_sizes(max_num_seqs, query, cap, uncapped))
    return tuple(sorted(s for s in sizes if s <= largest)) or (1,)


def _uniform_decode_sizes(max_num_seqs: int, query: int, cap: int, uncapped: int) -> list[int]:
    """vLLM 0.33's uniform decode batches: max_num_seqs itself where a row is one token, else n x `query`
    tokens for n in 1, 2, 4, 8..248 by 8, 256.. by 16 up to max_num_seqs (itself included, at most `cap`)."""
    if query == 1:
        return [max_num_seqs] if max_num_seqs <= uncapped else []
    most = min(max_num_seqs, cap)
    counts = {n for n in (1, 2, 4) if n <= most} | set(range(8, min(most + 1, 256), 8))
    counts |= set(range(256, most + 1, 16)) | {most}
    return [n * query for n in counts if n * query <= uncapped]
