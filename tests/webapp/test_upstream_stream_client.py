"""The upstream stream client against a real HTTP server on a socket: lines as they come, kept-alive connections
reused and replaced, silence, refusal and a connection cut short."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

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
            writer.write(_chunk(b": 2}\n\ndata: [DONE]\n\n"))
            await writer.drain()
            await asyncio.sleep(0.02)  # the body's last chunk comes later, as llama-server writes it
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def test(url: str) -> None:
        response = await _post(url)
        assert response.status == 200 and response.headers["content-type"] == "text/event-stream"
        lines = []
        while line := await response.line():
            lines.append(line)
        assert lines == [b'data: {"a": 1}\n', b"\n", b'data: {"b": 2}\n', b"\n", b"data: [DONE]\n", b"\n"]
        response.release()
        # read as the gateway reads it: up to [DONE], released before the blank line and the body's last chunk came
        for _ in range(2):
            response = await _post(url)
            while await response.line() != b"data: [DONE]\n":
                pass
            response.release()
            await asyncio.sleep(0.05)  # the last chunk comes meanwhile: the connection is back in the pool
        assert connections == 1

    asyncio.run(_serve(handler, test))


def _idle(url: str) -> list[stream_client._Connection]:
    """The stream client's idle connections to the server at `url`, on this loop."""
    parts = urlsplit(url)
    return stream_client._pool((parts.hostname or "", parts.port or 80, False)).idle


def _answer_once_then_close(idle_timeout: float) -> tuple[Handler, list[tuple[float, float]]]:
    """A server that answers one request per connection and closes it, as llama-server does after a streamed answer,
    and closes a connection that brings no request within `idle_timeout`; with the (accepted, asked) times of the
    connections that carried a request."""
    carried: list[tuple[float, float]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted = time.monotonic()
        try:
            await asyncio.wait_for(_read_request(reader), idle_timeout)
        except (TimeoutError, asyncio.IncompleteReadError):
            writer.close()
            return
        carried.append((accepted, time.monotonic()))
        body = b'{"ok": true}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    return handler, carried


def test_a_server_that_closes_after_each_answer_has_a_spare_connection_ready_for_the_next_request() -> None:
    handler, carried = _answer_once_then_close(idle_timeout=5.0)

    async def test(url: str) -> None:
        posted = []
        for _ in range(3):
            posted.append(time.monotonic())
            response = await _post(url)
            assert await response.read() == b'{"ok": true}'
            response.release()
            await asyncio.sleep(0.05)
        assert len(carried) == 3
        first, *later = carried
        assert first[0] >= posted[0]  # the first request connected itself
        for (accepted, _), asked in zip(later, posted[1:], strict=True):
            assert accepted < asked  # the later ones went on a connection opened before they were asked
        assert len(_idle(url)) == 1  # and one is ready for the next

    asyncio.run(_serve(handler, test))


def test_a_spare_the_server_closes_unused_is_not_replaced() -> None:
    handler, carried = _answer_once_then_close(idle_timeout=0.1)

    async def test(url: str) -> None:
        response = await _post(url)
        assert await response.read() == b'{"ok": true}'
        response.release()
        await asyncio.sleep(0.05)
        assert len(_idle(url)) == 1  # a spare
        await asyncio.sleep(0.3)  # past the server's idle timeout: it closed the spare
        assert not _idle(url)
        response = await _post(url)  # the next request connects itself
        assert await response.read() == b'{"ok": true}' and len(carried) == 2

    asyncio.run(_serve(handler, test))


def test_a_connection_the_client_closes_opens_no_spare() -> None:
    opened = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal opened
        opened += 1
        await _read_request(reader)
        writer.write(STREAM_HEAD + _chunk(b"data: {}\n\n"))
        await writer.drain()
        await reader.read()  # until the client leaves

    async def test(url: str) -> None:
        response = await _post(url)
        assert await response.line() == b"data: {}\n"
        response.close()  # as when the gateway's own client leaves mid-stream
        await asyncio.sleep(0.1)
        assert opened == 1 and not _idle(url)

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
