"""Returning a finished run's freed memory to the operating system."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
from functools import cache


#: Runs with fewer requests skip the release: their heap is small, and a collection plus a trim (~15 ms in
#: a busy process) would dominate a sweep of short runs.
RELEASE_FROM_REQUESTS = 20_000
#: glibc's `mallopt` parameter numbers (malloc.h) for the mmap and trim thresholds, and the values kept: blocks
#: of 1 MiB and more (the records' growing columns, the result tables) get mappings of their own; the heap's top
#: is given back past 32 MiB free (smaller thresholds cost the summary's many mid-sized temporaries a system
#: call each: at 128 KiB its CPU time doubled).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
TRIM_THRESHOLD, MMAP_THRESHOLD = 32 * 1024 * 1024, 1024 * 1024


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


def keep_large_blocks_apart(num_requests: int | None) -> None:
    """Before a run of at least RELEASE_FROM_REQUESTS requests: fix glibc's mmap threshold at 1 MiB and
    its trim threshold at 32 MiB (`mallopt`; nothing where it is missing), so that every block over it (the
    records' growing columns, the result tables) has a mapping of its own, grown without a copy and
    given back when freed. glibc otherwise raises the threshold each time it frees such a block, and
    the records' columns then grow by reallocation inside the heap, leaving holes behind (at 100k
    requests of issue 15's setup, ~55 MiB of a 275 MiB peak). Process-wide, and not undone: glibc
    cannot restore its sliding threshold."""
    if num_requests is None or num_requests < RELEASE_FROM_REQUESTS:
        return
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def _malloc_trim():
    return _libc_function("malloc_trim")


@cache
def _libc_function(name: str):
    """glibc's function `name`, or None where the C library has none. Looked up once per process:
    `find_library` may start a subprocess, too slow for a sweep of many short runs."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError, TypeError):
        return None
