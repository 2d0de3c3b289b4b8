"""The engine gives freed heap back to the OS (glibc's malloc_trim) after loading and when it goes idle."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import pytest

from inference.memory import return_free_memory


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_it_returns_freed_heap_pages_that_glibc_would_keep() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(4096) for _ in range(40_000)]  # 160 MB below the mmap threshold: the heap itself grows
    for chunk in chunks:
        ctypes.memset(chunk, 1, 4096)
    pin = libc.malloc(4096)  # keeps the heap's top in use, so free() alone cannot shrink it
    for chunk in chunks:
        libc.free(chunk)
    kept = _rss_mib()
    assert return_free_memory()
    assert _rss_mib() < kept - 100
    libc.free(pin)
