"""Calls into Django's cache from async code, at the cost the cache's kind allows.

The gateway's counters (rate limits, budgets) and the watch page's watcher count live in Django's cache. In this
process's memory (the default) a call answers in microseconds and is made here, on the event loop: a hop to a worker
thread and back would cost far more (a third of a millisecond or more of every request's time to first token on a
virtual machine, where waking a thread is slow). In Redis a call waits on the network, so it is made on a thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings

P = ParamSpec("P")
T = TypeVar("T")


def in_memory() -> bool:
    """Whether the default cache lives in this process (Django's local-memory cache)."""
    return str(settings.CACHES["default"]["BACKEND"]).endswith("LocMemCache")


async def call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)`, which uses the cache: inline when the cache is in memory, else on a thread."""
    if in_memory():
        return fn(*args, **kwargs)
    return await sync_to_async(fn)(*args, **kwargs)
