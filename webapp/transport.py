"""What the HTTP server (uvicorn: httptools' parser on uvloop) does before the application sees a request: every
request reaches the application, which answers in its own format and writes a usage row.

Oversized request headers get an answer, not a dropped connection. Header lines up to `TRANSPORT_HEADER_BYTES` in
all reach the application, so a request with, say, a 60 KB `Authorization` header is answered 431 in the API's own
format with a usage row (`webapp.api.views`, limit `APP_HEADER_BYTES`). Past the transport's limit a request is
refused before the application sees it: a 431 with an OpenAI-style JSON body, and no usage row (nothing was
identified yet). httptools keeps a header line whole until it ends, so a head still unfinished past the limit (one
endless line) is refused as its bytes come.

A WebSocket message past `WEBSOCKET_MESSAGE_BYTES` closes the socket with a close frame (1009) whose reason names
the limit (uvicorn's `ws_max_size`, see the `serve` command). Bodies, form bodies included, are the application's to
read: the server hands them on as bytes.
"""

from __future__ import annotations

import asyncio
import json

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
