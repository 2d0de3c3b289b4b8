"""Giving freed memory back to the operating system (glibc's allocator; elsewhere nothing to do).

Loading and a burst of requests allocate and free large buffers (file metadata, conversions, KV caches,
logits, activations). glibc keeps freed pages for reuse, so a long-running server would carry its busiest
moment as resident memory for as long as it lives. `malloc_trim` gives them back; it takes a few
milliseconds, so it runs after loading and when the last request has left, never between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache


@cache
def _glibc(name: str) -> Callable[..., int] | None:
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)  # glibc only
    except (OSError, AttributeError, TypeError):
        return None
    return function


def return_free_memory() -> bool:
    """Hand the C heap's free pages back to the OS (glibc); whether it could."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True
