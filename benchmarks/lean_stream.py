"""Lean streaming HTTP clients for the benchmarks: POST a JSON body, read the streamed answer line by line.

The benchmarks run their clients on the same two cores as the server they measure, so whatever
CPU time a client spends per chunk is taken from the server's threads — more from a faster
server. httpx parses every chunk in Python (h11, decoders, line splitting). These readers do what
a streaming benchmark needs and little else: plain HTTP/1.1, one small parser (`Answer`) fed with
whatever bytes arrive, lines split in C. `post_lines` serves many concurrent streams on asyncio;
`post_lines_blocking` reads one stream on a blocking socket, the least a Python client can spend.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

READ = 65536


class HTTPStatusError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class IncompleteAnswer(Exception):
    """The server closed the connection before the end of a chunked answer."""


class Answer:
    """An HTTP/1.1 answer, fed as its bytes arrive (`feed` returns the body's newly completed lines, without line
    endings); plain or chunked bodies. A status other than 200 raises HTTPStatusError once the head is in."""

    def __init__(self) -> None:
        self.done = False  # the last chunk of a chunked body has arrived
        self._buffer = b""
        self._in_body = False
        self._chunked = False
        self._chunk_left = 0  # body bytes still to come in the current chunk
        self._skip = 0  # the CRLF after a chunk
        self._pending = b""  # an unfinished line

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        if not self._in_body:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return []
            status_line, *headers = self._buffer[:end].decode("latin-1").split("\r\n")
            self._buffer = self._buffer[end + 4 :]
            self._in_body = True
            self._chunked = any(
                h.partition(":")[0].strip().lower() == "transfer-encoding" and "chunked" in h.lower() for h in headers
            )
            if int(status_line.split()[1]) != 200:
                raise HTTPStatusError(int(status_line.split()[1]))
        body = self._dechunk() if self._chunked else self._take_all()
        lines = (self._pending + body).split(b"\n")
        self._pending = lines.pop()
        return [line.rstrip(b"\r") for line in lines]

    def close(self) -> list[bytes]:
        """The connection ended: the last unfinished line, if any."""
        if self._chunked and not self.done:
            raise IncompleteAnswer()
        rest, self._pending = self._pending, b""
        return [rest] if rest else []

    def _take_all(self) -> bytes:
        body, self._buffer = self._buffer, b""
        return body

    def _dechunk(self) -> bytes:
        body = b""
        while self._buffer and not self.done:
            if self._skip:
                skipped = min(self._skip, len(self._buffer))
                self._buffer, self._skip = self._buffer[skipped:], self._skip - skipped
            elif self._chunk_left:
                taken = self._buffer[: self._chunk_left]
                body += taken
                self._buffer, self._chunk_left = self._buffer[len(taken) :], self._chunk_left - len(taken)
                self._skip = 0 if self._chunk_left else 2
            else:
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    break
                self._chunk_left = int(self._buffer[:end].split(b";")[0], 16)
                self._buffer = self._buffer[end + 2 :]
                self.done = self._chunk_left == 0
        return body


def _request(url: str, body: dict[str, Any], headers: dict[str, str] | None) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    head = [
        f"POST {parts.path or '/'} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Connection: close",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    return parts.hostname or "127.0.0.1", parts.port or 80, "\r\n".join(head).encode() + b"\r\n\r\n" + payload


async def post_lines(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> AsyncIterator[bytes]:
    """POST `body` as JSON to an http:// `url` and yield the answer's lines as they arrive (see `Answer` for errors;
    a broken connection raises OSError)."""
    host, port, request = _request(url, body, headers)
    reader, writer = await asyncio.open_connection(host, port)
    answer = Answer()
    try:
        writer.write(request)
        while not answer.done and (data := await reader.read(READ)):
            for line in answer.feed(data):
                yield line
        for line in answer.close():
            yield line
    finally:
        writer.close()


def post_lines_blocking(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Iterator[bytes]:
    """`post_lines` for one stream on a blocking socket (run it in a thread beside an event loop)."""
    host, port, request = _request(url, body, headers)
    answer = Answer()
    with socket.create_connection((host, port)) as sock:
        sock.sendall(request)
        while not answer.done and (data := sock.recv(READ)):
            yield from answer.feed(data)
        yield from answer.close()
