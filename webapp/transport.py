"""What the HTTP transport under Daphne (Twisted) does before the application sees a request: every request reaches
the application, which answers in its own format and writes a usage row. And what it does with an answer: each write
is sent at once (`HeaderLimitChannel._send`).

Oversized request headers get an answer, not a dropped connection.

Twisted's HTTP channel (under Daphne) closes the connection without a word when one header line passes 16 KiB,
and answers a bare 400 when all of them do. Here the transport reads header lines up to `TRANSPORT_HEADER_BYTES`, so
a request with, say, a 60 KB `Authorization` header reaches the application, which answers 431 in its own format
and writes a usage row (`webapp.api.views`, limit `APP_HEADER_BYTES`). Past the transport's limit a request is
refused before the application sees it: a 431 with an OpenAI-style JSON body, and no usage row (nothing was
identified yet).

A WebSocket message past Daphne's limit (1 MiB) closes the socket with a close frame and a reason, not a dropped
connection.

Form bodies are left to the application: Twisted parses a POSTed `multipart/form-data` body itself and answers a
malformed one (no boundary) with a bare 400 of its own; Daphne never needed that parse (it hands the raw body on), so
it is switched off, and the API answers such a body with its 400 and a usage row like any other that is not JSON.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from daphne import http_protocol
from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.web.http import HTTPChannel, _GenericHTTPChannelProtocol

from webapp.gateway.errors import GatewayError

APP_HEADER_BYTES = 16 * 1024
TRANSPORT_HEADER_BYTES = 128 * 1024

_BODY = json.dumps(
    GatewayError(
        431,
        f"The request's headers are larger than {TRANSPORT_HEADER_BYTES // 1024} KiB.",
        "invalid_request_error",
        "headers_too_large",
    ).body()
).encode()
TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\nConnection: close\r\n"
    + b"Content-Length: %d\r\n\r\n" % len(_BODY)
    + _BODY
)


class _Kept:
    """Stands in for the transport while Twisted writes a response's head: keeps its bytes."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writeSequence(self, iovec: list[bytes]) -> None:
        self.parts.extend(iovec)


class HeaderLimitChannel(HTTPChannel):
    """Twisted's channel with larger header limits, answering 431 instead of closing or a bare 400 past them."""

    MAX_LENGTH = TRANSPORT_HEADER_BYTES
    totalHeadersSize = TRANSPORT_HEADER_BYTES
    _head = b""  # a response's status line and headers, not sent yet (see `writeHeaders`)

    def lineLengthExceeded(self, line: bytes) -> None:
        self._refuse()

    def lineReceived(self, line: bytes) -> None:
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            self._refuse()
            return
        super().lineReceived(line)

    def write(self, data: bytes) -> None:
        self._send(data)

    def writeSequence(self, iovec: list[bytes]) -> None:
        self._send(b"".join(iovec))

    def writeHeaders(self, version: bytes, code: bytes, reason: bytes, headers: Any) -> None:
        """A response's head leaves with its first body bytes, in one send.

        Twisted writes the head straight into the transport's buffer, where it waits for the next loop turn, and with
        it the body's first bytes that `_send` would have sent at once: every response's first chunk (a stream's first
        token) went out a loop turn late, after two `epoll_ctl` calls. Here the head is kept for the write that
        follows it in the same call (`Request.write` writes both); a response with no body bytes after its head
        (HEAD, 204, an empty body) gets it on the next loop turn, or as the connection closes."""
        kept = _Kept()
        transport, self.transport = self.transport, kept  # type: ignore[assignment]
        try:
            super().writeHeaders(version, code, reason, headers)
        finally:
            self.transport = transport
        self._head += b"".join(kept.parts)
        asyncio.get_running_loop().call_soon(self._flush_head)  # Daphne runs Twisted on asyncio's loop

    def _flush_head(self) -> None:
        if self._head and self.transport is not None:
            self._send(b"")

    def loseConnection(self) -> None:
        self._flush_head()  # a head with no body after it (HEAD, 204) goes before the connection closes
        super().loseConnection()

    def _send(self, data: bytes) -> None:
        """Send at once what the socket takes, and leave only the rest to Twisted's buffer and the event loop.

        Twisted's transport only buffers a write and registers its socket with the loop, which sends on a later
        turn and then unregisters it: two `epoll_ctl` calls and a loop turn for every streamed chunk. On two cores
        shared with a busy model server the process was often descheduled in between, and a streamed token reached
        the client 1.8 ms after the gateway had it (0.4 ms when sent at once; benchmarks/bench_gateway.py on
        llama-server). So when nothing is waiting in the transport's buffer, the bytes go straight to the socket
        (`writeSomeData`, the TCP transport's own send); what it does not take, or a send that fails, goes the usual
        way, and so does everything on a connection that is closing or not plain TCP."""
        if self._head:
            data, self._head = self._head + data, b""
        transport: Any = self.transport
        if (
            data
            and transport is not None
            and hasattr(transport, "writeSomeData")
            and transport.connected
            and not transport.disconnecting
            and not transport.dataBuffer
            and not transport._tempDataBuffer
        ):
            sent = transport.writeSomeData(data)
            if isinstance(sent, int) and sent > 0:
                data = data[sent:]
                if not data:
                    return
        super().write(data)

    def _refuse(self) -> None:
        if self.transport is not None:
            self.transport.write(TOO_LARGE)  # type: ignore[call-arg,misc]  # zope interface methods read as unbound
        self.loseConnection()


class FormsLeftToTheApplication(WebRequest):
    """Daphne's request, without Twisted's own parse of form bodies."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parsePOSTFormSubmission = False


def _channel(factory: Any) -> _GenericHTTPChannelProtocol:
    return _GenericHTTPChannelProtocol(HeaderLimitChannel())


def close_oversized_sockets_cleanly(ws_factory: Any) -> None:
    """A WebSocket message past Daphne's 1 MiB limit closes the socket with a close frame (1009, "message too big",
    and the limit in its reason) instead of autobahn's default, dropping the TCP connection without a word."""
    ws_factory.setProtocolOptions(failByDrop=False)


def install() -> None:
    """Make Daphne's HTTP factory build `HeaderLimitChannel`s, and leave form bodies to the application (before
    `Server.run`)."""
    HTTPFactory.protocol = _channel
    http_protocol.WebRequest = FormsLeftToTheApplication  # what HTTPFactory.buildProtocol builds
