"""What the HTTP server (uvicorn: httptools' parser on uvloop) does before the application sees a request: every
request reaches the application, which answers in its own format and writes a usage row.

Oversized request headers get an answer, not a dropped connection. Header lines up to `TRANSPORT_HEADER_BYTES` in
all reach the application, so a request with, say, a 60 KB `Authorization` header is answered 431 in the API's own
format with a usage row (`webapp.api.views`, limit `APP_HEADER_BYTES`). Past the transport's limit a request is
refused before the application sees it: a 431 with an OpenAI-style JSON body, and no usage row (nothing was
identified yet). httptools keeps a header line whole until it ends, so a head still unfinished past the limit (one
endless line) is refused as its bytes come.

A response's head is written with its first body part, in one write (`HeadWithFirstPart`): a client gets them in one
segment, not the head alone first. That is one send and one client wake-up fewer on every request's way to its first
byte. A stream whose first part is not ready at once still gets its head at once: it is written on the loop's next
turn.

A WebSocket message past `WEBSOCKET_MESSAGE_BYTES` closes the socket with a close frame (1009) whose reason names
the limit (uvicorn's `ws_max_size`, see the `serve` command). Bodies, form bodies included, are the application's to
read: the server hands them on as bytes.
"""

from __future__ import annotations

import asyncio
import json
from typing import cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from webapp.gateway.errors import GatewayError

APP_HEADER_BYTES = 16 * 1024
TRANSPORT_HEADER_BYTES = 128 * 1024
WEBSOCKET_MESSAGE_BYTES = 1024 * 1024
LINGER_SECONDS = 2.0  # after a 431, how long the rest of a refused head is read and dropped

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


class HeaderLimitProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering 431 in the API's shape past `TRANSPORT_HEADER_BYTES` of headers."""

    _in_head = True  # between a request's first byte and the end of its headers (or before the first request)
    _head_bytes = 0  # the request line's and headers' bytes so far
    _refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        waited = self._in_head
        super().data_received(data)
        if waited and self._in_head and not self._refused:
            self._head_bytes += len(data)  # a head still unfinished: its raw bytes count, an endless line included
            if self._head_bytes > TRANSPORT_HEADER_BYTES:
                self._refuse()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        if not self._refused:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if not self._refused:
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.transport is self.transport:  # not an upgrade to a WebSocket
                cycle.transport = cast(asyncio.Transport, HeadWithFirstPart(self.transport))

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()
        self._in_head, self._head_bytes = True, 0

    def _count(self, size: int) -> None:
        """Refused as soon as the head passes the limit: the rest of it is dropped unparsed, so the answer cannot wait
        for its end."""
        self._head_bytes += size
        if self._head_bytes > TRANSPORT_HEADER_BYTES:
            self._refuse()

    def _refuse(self) -> None:
        """Answer 431, then close our side and read (and drop) what the client still sends for a moment before the
        socket closes: closed with the rest of the head unread, the kernel would reset the connection, and a client
        still sending could lose the answer."""
        if self._refused:
            return
        self._refused = True
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(TOO_LARGE)
        if transport.can_write_eof():
            transport.write_eof()
            asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)
        else:
            transport.close()


class HeadWithFirstPart:
    """One response's view of its connection's transport: its first write (the status line and headers) is held until
    the next write, which carries it, or the loop's next turn, whichever comes first.

    uvicorn writes the head as soon as the application starts its response, and each body part as it comes. An API
    stream's first part is usually ready at once (an upstream's first chunk has come before the view answers), so
    the head alone went out first: one more send on loopback, and one more wake-up of the client, which read the head
    and waited again. Anything else a response does to its transport goes to the transport itself, after the held
    head."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None
        self._started = False

    def write(self, data: bytes) -> None:
        if not self._started:
            self._started = True
            self._held = data
            self._flush = asyncio.get_running_loop().call_soon(self.flush)
            return
        if self._held is not None:
            data = self._held + data
            self._drop_held()
        self.transport.write(data)

    def flush(self) -> None:
        """Write the held head now (the loop's next turn, or before the transport is closed)."""
        if self._held is not None:
            held = self._held
            self._drop_held()
            if not self.transport.is_closing():
                self.transport.write(held)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def _drop_held(self) -> None:
        self._held = None
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None

    def __getattr__(self, name: str) -> object:
        return getattr(self.transport, name)
