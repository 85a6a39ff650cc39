"""Returning a finished run's freed memory to the operating system."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
from functools import cache


#: Runs with fewer requests skip the release: their heap is small, and a collection plus a trim (~15 ms in
#: a busy process) would dominate a sweep of short runs.
RELEASE_FROM_REQUESTS = 20_000


def release_freed_memory(num_requests: int | None = None) -> None:
    """Collect the finished engine's cycles and give the heap's free pages back (glibc's `malloc_trim`;
    elsewhere only the collection), for a run of at least RELEASE_FROM_REQUESTS requests (`num_requests`
    None: always). The engine frees its per-request objects as requests
    finish, leaving holes in the heap that the result tables, allocated in large blocks of their own,
    cannot reuse; without this a million-request run's results would sit on top of them."""
    if num_requests is not None and num_requests < RELEASE_FROM_REQUESTS:
        return
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none. Looked up once per process:
    `find_library` may start a subprocess, too slow for a sweep of many short runs."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim")
    except (OSError, AttributeError, TypeError):
        return None
