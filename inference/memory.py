"""Giving freed memory back to the operating system when the engine goes idle.

A burst of requests grows the C heap (KV caches, logits, activations); glibc keeps freed pages for
reuse, so the worker's resident memory would stay at the burst's peak for as long as it lives.
`malloc_trim` returns them; it takes a few milliseconds, so it runs only when the last request has
left, never between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache
from typing import Callable


@lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim  # glibc only
    except (OSError, AttributeError, TypeError):
        return None
    return trim


def return_free_memory() -> bool:
    """Hand the C heap's free pages back to the OS (glibc); whether it could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
