"""Running a coroutine to completion from a sync test, whatever loop the test's own thread has running.

Playwright's sync API keeps an event loop running on the main thread for the rest of the
session once the browser tests have started, so asyncio.run() there would refuse.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()
