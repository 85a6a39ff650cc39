"""Returning a finished run's freed memory to the operating system."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc


def release_freed_memory() -> None:
    """Collect the finished engine's cycles and give the heap's free pages back (glibc's
    `malloc_trim`; elsewhere only the collection). The engine frees its per-request objects as requests
    finish, leaving holes in the heap that the result tables, allocated in large blocks of their own,
    cannot reuse; without this a million-request run's results would sit on top of them."""
    gc.collect()
    name = ctypes.util.find_library("c")
    try:
        getattr(ctypes.CDLL(name), "malloc_trim")(0)
    except (OSError, AttributeError, TypeError):
        pass
