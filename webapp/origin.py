"""The WebSocket's same-origin check: scheme, host and port, not only the host.

Channels' `AllowedHostsOriginValidator` compares an Origin's host with ALLOWED_HOSTS and ignores
its port, so a page served by another program on `http://localhost:9999` could open this site's
socket with the visitor's session. Here the Origin must name exactly the site the socket was
opened on (the Host header, with the default port of the scheme filled in), or one of
`CSRF_TRUSTED_ORIGINS` (for a site behind a proxy on another host name).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _origin(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the default port filled in; None when unreadable."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return ("https" if scheme in ("https", "wss") else "http", parts.hostname.lower(), port)


def same_origin(origin: str, host: str, secure: bool) -> bool:
    """Whether a browser's Origin header names the site at `host` (the socket's Host header)."""
    try:
        given = urlsplit(origin)
    except ValueError:
        return False
    claimed = _origin(given.scheme, given.netloc) if given.scheme else None
    if claimed is None:
        return False
    if claimed == _origin("https" if secure else "http", host):
        return True
    trusted = [_origin(urlsplit(o).scheme, urlsplit(o).netloc) for o in getattr(settings, "CSRF_TRUSTED_ORIGINS", [])]
    return claimed in trusted


class SameOriginValidator:
    """ASGI middleware for WebSocket scopes: deny the handshake unless the Origin is this very site."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin", b"").decode("latin-1")
        host = headers.get(b"host", b"").decode("latin-1")
        if not origin or not host or not same_origin(origin, host, scope.get("scheme") == "wss"):
            return await WebsocketDenier()(scope, receive, send)
        return await self.app(scope, receive, send)
