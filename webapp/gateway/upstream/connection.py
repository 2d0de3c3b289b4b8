"""What the gateway sends an upstream server, and what an upstream's failure becomes; the HTTP client for its short
calls (health probes, the tokenizer).

Generations travel on `stream_client`, the gateway's own lean client. The short calls use one
`aiohttp.ClientSession` per event loop, which keeps connections alive between requests; connect and silence have
their own timeouts (settings). aiohttp, not httpx: its C parser read an upstream's first line in 0.45 ms against
httpx's 1.0 ms (measured on loopback against llama-server; see docs/upstreams.md).
"""

from __future__ import annotations

import asyncio
import json
import weakref
from typing import Any

import aiohttp
from django.conf import settings

from webapp.catalog import Upstream
from webapp.gateway.errors import GatewayError
from webapp.gateway.upstream import stream_client

_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = weakref.WeakKeyDictionary()


def http() -> aiohttp.ClientSession:
    """This loop's session (made on first use)."""
    loop = asyncio.get_running_loop()
    found = _sessions.get(loop)
    if found is None or found.closed:
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=settings.ROUNDTRIP_UPSTREAM_CONNECT_TIMEOUT,
            sock_read=settings.ROUNDTRIP_UPSTREAM_TIMEOUT,
        )
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, enable_cleanup_closed=True)
        found = _sessions[loop] = aiohttp.ClientSession(
            timeout=timeout, connector=connector, trust_env=False, auto_decompress=False
        )
    return found


def why(exc: BaseException) -> str:
    """A failed connection or read, in a few words."""
    if isinstance(exc, asyncio.TimeoutError):
        return f"timed out ({exc or type(exc).__name__})"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"could not connect ({exc.os_error or type(exc).__name__})"
    if isinstance(exc, stream_client.UpstreamConnectError):
        return f"could not connect ({exc})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


FAILURES = (  # what a connection or read to an upstream may raise
    aiohttp.ClientError,
    asyncio.TimeoutError,
    stream_client.UpstreamConnectError,
    stream_client.UpstreamDisconnected,
)


def headers(upstream: Upstream, request_id: str = "") -> dict[str, str]:
    out = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
    if upstream.api_key:
        out["Authorization"] = f"Bearer {upstream.api_key}"
    if request_id:
        out["X-Request-Id"] = request_id
    return out


RETRYABLE = frozenset({408, 409, 429, 500, 502, 503, 504})
EXHAUSTED = frozenset({"upstream_unavailable", "upstream_timeout", "upstream_rate_limited"})  # see `exhausted`


def upstream_message(body: bytes) -> tuple[str, str, str | None]:
    """(message, code, param) from an upstream's error body in OpenAI's shape, or its text."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")[:500].strip() or "no message", "", None
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        message = error.get("message") or json.dumps(error)[:500]
        return str(message), str(error.get("code") or error.get("type") or ""), error.get("param")
    return str(error)[:500], "", None


def refused(upstream: Upstream, status: int, body: bytes) -> GatewayError:
    """A 4xx the upstream gave a valid request of ours: the client's own mistake (too long a prompt, a bad value),
    passed on in OpenAI's shape."""
    message, code, param = upstream_message(body)
    return GatewayError(
        status if 400 <= status < 500 else 502,
        f"The upstream {upstream.name} refused the request: {message}",
        "invalid_request_error" if status < 500 else "server_error",
        code or "upstream_refused",
        param if isinstance(param, str) else None,
    )


def exhausted(model: str, tried: list[dict[str, Any]]) -> GatewayError:
    """Every server a request could try failed before its first byte."""
    last = tried[-1] if tried else {}
    detail = "; ".join(f"{t['upstream']}: {t['error']}" for t in tried) or "no upstream server is configured"
    if last.get("status") == 429:
        return GatewayError(
            429,
            f"Every upstream server of {model!r} is rate limiting ({detail}); retry shortly.",
            "rate_limit_error",
            "upstream_rate_limited",
            headers={"Retry-After": "2"},
        )
    timed_out = last.get("status") is None and "timed out" in str(last.get("error", ""))
    return GatewayError(
        504 if timed_out else 502,
        f"No upstream server of {model!r} answered ({detail}).",
        "server_error",
        "upstream_timeout" if timed_out else "upstream_unavailable",
        headers={"Retry-After": "2"},
    )


def broken(upstream: Upstream, why: str) -> GatewayError:
    """The upstream failed after the stream began: the client's stream ends with this error."""
    return GatewayError(502, f"The upstream {upstream.name} failed mid-stream: {why}", "server_error", "upstream_error")
