"""The upstream stream client against a real HTTP server on a socket: lines as they come, kept-alive connections
reused and replaced, silence, refusal and a connection cut short."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

import pytest

from webapp.gateway.upstream import stream_client

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return await reader.readexactly(length)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def _one_line_streamed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read the request, answer with a stream's head and one line."""
    await _read_request(reader)
    writer.write(STREAM_HEAD + _chunk(b"data: {}\n\n"))
    await writer.drain()


async def _serve(handler: Handler, test: Callable[[str], Awaitable[None]]) -> None:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await test(f"http://127.0.0.1:{port}/v1/chat/completions")
    finally:
        server.close()


async def _post(url: str, silence: float = 5.0) -> stream_client.Response:
    return await stream_client.post(url, b'{"stream": true}', {"Content-Type": "application/json"}, 2.0, silence)


def test_a_chunked_stream_is_read_line_by_line_as_it_arrives_and_its_connection_is_reused_after_done() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while not reader.at_eof():
            try:
                assert await _read_request(reader) == b'{"stream": true}'
            except asyncio.IncompleteReadError:
                break
            writer.write(STREAM_HEAD + _chunk(b'data: {"a": 1}\n\ndata: {"b"'))
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(_chunk(b": 2}\n\ndata: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()

    async def test(url: str) -> None:
        response = await _post(url)
        assert response.status == 200 and response.headers["content-type"] == "text/event-stream"
        lines = []
        while line := await response.line():
            lines.append(line)
        assert lines == [b'data: {"a": 1}\n', b"\n", b'data: {"b": 2}\n', b"\n", b"data: [DONE]\n", b"\n"]
        response.release()
        # read as the gateway reads it: up to [DONE], leaving the blank line that ends that event
        for _ in range(2):
            response = await _post(url)
            while await response.line() != b"data: [DONE]\n":
                pass
            await asyncio.sleep(0.01)  # the final chunk is in
            response.release()
        assert connections == 1

    asyncio.run(_serve(handler, test))


def test_a_kept_alive_connection_the_server_closed_is_replaced_by_a_new_one() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        body = b'{"ok": true}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()  # after answering, as llama-server does after a streamed answer

    async def test(url: str) -> None:
        for _ in range(3):
            response = await _post(url)
            assert await response.read() == b'{"ok": true}'
            response.release()
            await asyncio.sleep(0.05)
        assert connections == 3

    asyncio.run(_serve(handler, test))


def test_an_upstream_that_goes_silent_raises_after_the_silence_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _one_line_streamed(reader, writer)
        await asyncio.sleep(5)

    async def test(url: str) -> None:
        response = await _post(url, silence=0.3)
        assert await response.line() == b"data: {}\n"
        await response.line()
        started = time.monotonic()
        with pytest.raises(stream_client.UpstreamSilent):
            await response.line()
        assert time.monotonic() - started < 1.0

    asyncio.run(_serve(handler, test))


def test_a_stream_cut_short_raises_disconnected() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _one_line_streamed(reader, writer)
        writer.transport.abort()

    async def test(url: str) -> None:
        response = await _post(url)
        with pytest.raises(stream_client.UpstreamDisconnected):
            while await response.line():
                pass

    asyncio.run(_serve(handler, test))


def test_a_refused_connection_raises_connect_error() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(stream_client.UpstreamConnectError):
        asyncio.run(_post(f"http://127.0.0.1:{port}/v1/chat/completions"))
