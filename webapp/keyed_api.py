"""The API's own way in for requests that carry an API key: Django's handler without the page's middleware.

The page's middleware (sessions, CSRF, signed-in users, messages, framing and CSP headers) is written for browsers,
and Django runs each of these middlewares' hooks on a worker thread when it serves an async view: about fifteen thread
hops per request, several milliseconds of every API request's time to first token. A request to `/v1/` that carries
a key (`Authorization` or Anthropic's `x-api-key`) needs none of it: the key is checked by the gateway, there is no
cookie to protect and no page to frame. Everything else (the pages, and the page's own calls to the API on its
session) keeps the full stack. The host is still checked against ALLOWED_HOSTS, as CommonMiddleware would.

For the same reason a keyed request skips two more thread hops Django makes for every request (a new thread for its
synchronous calls, and the `request_started` signal's synchronous receivers): see `KeyedApiHandler`.

Its synchronous calls share one thread that lives as long as the process, so that thread keeps its database
connection from one request to the next (`keep_connections_on_this_thread`), as a WSGI worker's thread does; Django
closes the connections of the page's per-request threads after each request, as it must under ASGI.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse
from django.urls import ResolverMatch, URLResolver, get_resolver, set_script_prefix

ASGIApp = Any
KEY_HEADERS = frozenset({b"authorization", b"x-api-key"})


_thread = threading.local()


def keep_connections_on_this_thread() -> None:
    """From now on this thread's database connections stay open after each request, whatever CONN_MAX_AGE says:
    Django still closes one that broke or was left mid-transaction, and checks it before its next use
    (CONN_HEALTH_CHECKS). Opening and closing SQLite for every request cost an API request 2.6 ms of CPU (the close
    checkpoints the log, syncs the file twice and deletes two files); a PostgreSQL connection is a TCP handshake and
    a login."""
    _thread.keeps_connections = True
    for connection in connections.all(initialized_only=True):
        connection.close_at = None


@receiver(connection_created)
def _kept_open(sender: type, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if getattr(_thread, "keeps_connections", False):
        connection.close_at = None  # Django closes a connection at the end of a request once past this


class KeyedApiHandler(ASGIHandler):
    """Django's ASGI handler with no middleware (the URL resolver, views and error pages as usual)."""

    _thread_ready = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's entry without its per-request thread-sensitive context, which starts a new thread for each
        request's first call to synchronous code: here such calls (a usage row, a key looked up) share one thread that
        lives as long as the process (measured: two thread starts and a third of the futex calls per request gone),
        and keep its database connection. They are short and few; a page's request keeps Django's own context."""
        if not KeyedApiHandler._thread_ready:
            KeyedApiHandler._thread_ready = True
            await sync_to_async(keep_connections_on_this_thread)()
        await self.handle(scope, receive, send)

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's `handle` less the `request_started` signal. Its receivers (close this thread's stale database
        connections, clear the query log) are synchronous, so Django sends it through a worker thread and back before
        every request: 0.4 ms of a keyed request's time to first token, measured. The API's database calls run on one
        thread (see `__call__`), where `request_finished`, sent as the response closes, does the same after every
        request."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, response = self.create_request(scope, body_file)
        try:
            if request is None:
                await self.send_response(response, send)
            else:
                response = await self._answer(request, receive, send)
        finally:
            body_file.close()
        if response is None:
            await signals.request_finished.asend(sender=self.__class__)
        else:
            await sync_to_async(response.close)()

    async def _answer(self, request: HttpRequest, receive: Any, send: Any) -> HttpResponseBase | None:
        """The view's response, sent as it is made; None when the client left first (the view is cancelled, as
        Django does, so a stream stops its model)."""

        async def respond() -> HttpResponseBase:
            response: HttpResponseBase = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):  # the client left while it was sent
                await self.send_response(response, send)
            return response

        listener = asyncio.create_task(self.listen_for_disconnect(receive))
        responder = asyncio.create_task(respond())
        await asyncio.wait([listener, responder], return_when=asyncio.FIRST_COMPLETED)
        for task in (listener, responder):
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                await task
        return None if responder.cancelled() else responder.result()

    async def send_response(self, response: HttpResponseBase, send: Any) -> None:
        """Django's `send_response`, less two generator layers on a stream: each part of an async streaming response
        (bytes, an SSE event per streamed token) is sent as its iterator yields it. Django passes every part through
        `__aiter__`, `streaming_content`'s wrapper and `chunk_bytes` on its way to the socket; a keyed request's streams
        are the API's own SSE bytes, which need none of it. Anything else is Django's."""
        if not (isinstance(response, StreamingHttpResponse) and response.is_async):
            await super().send_response(response, send)
            return
        headers = [(name.encode("ascii"), value.encode("latin1")) for name, value in response.items()]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        async with contextlib.aclosing(response._iterator) as parts:  # closed as Django does: a client that leaves
            async for part in parts:
                await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body"})

    def resolve_request(self, request: HttpRequest) -> ResolverMatch:
        """Django's URL resolution, once per path: the API's few paths are resolved again on every request otherwise
        (the patterns tried in turn, a match object built), 40 us of each request's way to its first token."""
        match = _resolved(get_resolver(), request.path_info)
        request.resolver_match = match
        return match

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        self._middleware_chain = convert_exception_to_response(self._checked_host)

    async def _checked_host(self, request: HttpRequest) -> HttpResponseBase:
        """The view's response. With no middleware, no atomic requests and async views, Django's
        `_get_response_async` comes down to calling the view; it is called directly (its checks for view and template
        middleware, and the thread hop it makes to ask exception middleware about an error, cost a keyed request 30 us
        on its way to the first token). A synchronous view goes Django's way."""
        request.get_host()  # DisallowedHost: a 400, as for every other request
        match = self.resolve_request(request)
        if not _is_async_view(match.func) or _atomic_requests():
            response: HttpResponseBase = await self._get_response_async(request)
            return response
        response = await match.func(request, *match.args, **match.kwargs)
        self.check_response(response, match.func)  # a view that returned None is a 500 that says so, as in Django
        return response


@functools.lru_cache(maxsize=512)
def _resolved(resolver: URLResolver, path: str) -> ResolverMatch:
    """The match for `path` (Resolver404 is raised, not kept). Keyed by the resolver too: a test that changes the URL
    configuration gets a new one."""
    match: ResolverMatch = resolver.resolve(path)
    return match


@functools.cache
def _is_async_view(view: Any) -> bool:
    return iscoroutinefunction(view)


def _atomic_requests() -> bool:
    """Whether a database wraps every view in a transaction (Django's ATOMIC_REQUESTS), which Django's way does."""
    return any(db.get("ATOMIC_REQUESTS") for db in connections.settings.values())


def keyed_api_request(scope: dict[str, Any]) -> bool:
    """An HTTP request to the API that names its key."""
    return (
        scope["type"] == "http"
        and scope["path"].startswith("/v1/")
        and any(name in KEY_HEADERS for name, _ in scope.get("headers", ()))
    )


class KeyedApiRouter:
    """ASGI: keyed API requests to `keyed`, everything else to `full`."""

    def __init__(self, keyed: ASGIApp, full: ASGIApp) -> None:
        self.keyed = keyed
        self.full = full

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        app = self.keyed if keyed_api_request(scope) else self.full
        await app(scope, receive, send)
