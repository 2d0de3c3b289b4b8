"""Starting the inference worker inside the web process, on the server's own event loop.

The in-memory channel layer only connects coroutines of one process and one loop, so
the default set-up runs the worker as a task beside the web server's. `ensure_started` is
idempotent: the `serve` command calls it when the server is ready (so the model loads at
once, with progress), and the ASGI application on its first request as a fallback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from webapp.catalog import local_models

log = logging.getLogger("roundtrip.worker")
_task: asyncio.Task[None] | None = None


def ensure_started(loop: asyncio.AbstractEventLoop | None = None) -> None:
    global _task
    if not settings.ROUNDTRIP_INPROCESS_WORKER or (_task is not None and not _task.done()):
        return
    if not local_models():  # every model is an upstream server's: nothing to load here
        return
    from webapp.worker.service import serve  # the engine (torch) loads only where the worker runs

    loop = loop or asyncio.get_event_loop()
    _task = loop.create_task(serve())
    _task.add_done_callback(_report_exit)


def _report_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the in-process inference worker stopped", exc_info=task.exception())


ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class StartWorkerMiddleware:
    """ASGI middleware: make sure the in-process worker runs before the first request is handled."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        ensure_started(asyncio.get_running_loop())
        await self.app(scope, receive, send)
