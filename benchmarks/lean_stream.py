"""A lean streaming HTTP client for the benchmarks: POST a JSON body, read the streamed answer line by line.

The benchmarks run their clients on the same two cores as the server they measure. httpx parses
every chunk in Python (h11, decoders, line splitting), which at a few hundred tokens a second
takes a noticeable share of a core away from the server's threads, and more from a faster server.
This reader does what a streaming benchmark needs and little else: plain HTTP/1.1 over asyncio
streams, chunked transfer decoding, lines split in C. Every server in a run is read by it alike.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator
from urllib.parse import urlsplit


class HTTPStatusError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


async def post_lines(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> AsyncIterator[bytes]:
    """POST `body` as JSON to an http:// `url` and yield the answer's lines (without line endings) as they arrive.
    A status other than 200 raises HTTPStatusError; a broken connection raises OSError or asyncio.IncompleteReadError."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    payload = json.dumps(body).encode()
    head = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close", "Content-Type: application/json",
            f"Content-Length: {len(payload)}", *(f"{name}: {value}" for name, value in (headers or {}).items())]
    try:
        writer.write("\r\n".join(head).encode() + b"\r\n\r\n" + payload)
        status = int((await reader.readline()).split()[1])
        chunked = False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            chunked = chunked or (name.strip().lower() == "transfer-encoding" and "chunked" in value.lower())
        if status != 200:
            raise HTTPStatusError(status)
        pending = b""
        async for data in (_chunks(reader) if chunked else _until_closed(reader)):
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            for line in lines:
                yield line.rstrip(b"\r")
        if pending:
            yield pending
    finally:
        writer.close()


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        header = await reader.readline()
        if not header:  # closed before the last chunk
            raise asyncio.IncompleteReadError(b"", None)
        size = int(header.split(b";")[0].strip(), 16)
        if size == 0:
            return
        yield await reader.readexactly(size)
        await reader.readexactly(2)  # the CRLF after each chunk


async def _until_closed(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while data := await reader.read(65536):
        yield data
