"""The API's own way in for requests that carry an API key: Django's handler without the page's middleware.

The page's middleware (sessions, CSRF, signed-in users, messages, framing and CSP headers) is written for browsers,
and Django runs each of these middlewares' hooks on a worker thread when it serves an async view: about fifteen thread
hops per request, several milliseconds of every API request's time to first token. A request to `/v1/` that carries
a key (`Authorization` or Anthropic's `x-api-key`) needs none of it: the key is checked by the gateway, there is no
cookie to protect and no page to frame. Everything else (the pages, and the page's own calls to the API on its
session) keeps the full stack. The host is still checked against ALLOWED_HOSTS, as CommonMiddleware would.
"""

from __future__ import annotations

from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase

ASGIApp = Any
KEY_HEADERS = frozenset({b"authorization", b"x-api-key"})


class KeyedApiHandler(ASGIHandler):
    """Django's ASGI handler with no middleware (the URL resolver, views and error pages as usual)."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        self._middleware_chain = convert_exception_to_response(self._checked_host)

    async def _checked_host(self, request: HttpRequest) -> HttpResponseBase:
        request.get_host()  # DisallowedHost: a 400, as for every other request
        response: HttpResponseBase = await self._get_response_async(request)
        return response


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
