"""The HTTP client that carries a generation to an upstream server and its stream back, line by line.

This is the gateway's hot path: every streamed token of an upstream model passes through it, on the same cores as
the model server it waits for. aiohttp spent about 1 ms of CPU connecting, sending and reading the response's head,
and for every chunk fed a stream reader, rescheduled a per-read timer and woke a reader task. Here the socket is an
asyncio protocol and httptools (llhttp, in C) parses the response, chunked bodies included: a chunk's bytes are
appended to one buffer and wake the one waiting reader. The silence timeout is one watchdog per response that looks
at when bytes last came, not a timer moved on every read. Connections are kept alive per server and reused (a
stream read up to its `[DONE]` drains its last bytes first); one the server closed leaves the pool as it closes; a
server that closes after every answer gets a spare opened between requests (`_Pool`). The probes and the tokenizer
calls (once a request at most, off the stream) keep aiohttp's general client (`connection.http`).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
import weakref
from typing import cast
from urllib.parse import urlsplit

import httptools

IDLE_SECONDS = 30.0  # a kept-alive connection unused longer is closed, not reused (servers close theirs too)
DRAIN_SECONDS = 2.0  # how long a released response's last bytes may take to come before its connection is dropped


class UpstreamConnectError(ConnectionError):
    """The server could not be reached (refused, unreachable, or the connect timed out)."""


class UpstreamConnectTimeout(UpstreamConnectError, TimeoutError):
    """The connect took longer than its timeout."""


class UpstreamDisconnected(ConnectionError):
    """The connection closed, or broke, before the response was complete."""


class UpstreamSilent(TimeoutError):
    """No byte came for longer than the silence timeout."""


class _Unanswered(UpstreamDisconnected):
    """The connection closed before any byte of the answer came: on a reused connection, the server had closed it."""


Key = tuple[str, int, bool]  # host, port, TLS


class _Pool:
    """One server's idle connections on one event loop, and the spare one it is opening, if any.

    llama-server closes the connection after every streamed answer (its `Keep-Alive` header notwithstanding), so
    without a spare every request to it first connected and waited for the server to accept and hand the socket to a
    thread: work on the way to the first token that a direct client pays once and the gateway paid twice. When a
    connection that carried a response is closed by the server and nothing idle is left, a spare is opened at once,
    between requests, for the next request to take. A spare that the server closes unused (idle too long) is not
    replaced: a gateway nobody uses holds no connections."""

    def __init__(self, key: Key) -> None:
        self.key = key
        self.idle: list[_Connection] = []
        self.within = 5.0  # the connect timeout a spare gets: the last one a request gave
        self._spare: asyncio.Task[None] | None = None

    def reused(self) -> _Connection | None:
        """The most recently used idle connection, if one is still open and fresh."""
        now = time.monotonic()
        while self.idle:
            connection = self.idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE_SECONDS:
                return connection
            connection.close()
        return None

    def add(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        self.idle.append(connection)

    def remove(self, connection: _Connection) -> None:
        if connection in self.idle:
            self.idle.remove(connection)

    def keep_one_ready(self) -> None:
        """Open a spare connection unless one is idle here or being opened."""
        if self._spare is None and not any(not c.closed for c in self.idle):
            self._spare = asyncio.get_running_loop().create_task(self._open_spare())

    async def _open_spare(self) -> None:
        try:
            self.add(await _connect(self, self.within))
        except UpstreamConnectError:
            pass  # the next request connects itself, and reports what fails
        finally:
            self._spare = None


class _Connection(asyncio.Protocol):
    """One kept-alive connection; it carries one response at a time."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.carried = False  # it has carried a request (a spare not yet used has not)
        self.idle_since = 0.0
        self.response: Response | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # bytes nobody asked for: the connection cannot be trusted again
            self.close()
            return
        response.received(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        by_the_server = not self.closed
        self.closed = True
        self.pool.remove(self)
        response = self.response
        if response is not None:
            response.lost(exc)
        if by_the_server and self.carried and (response is None or response.complete):  # it closes after answers
            self.pool.keep_one_ready()

    def close(self) -> None:
        self.closed = True
        self.pool.remove(self)
        if self.transport is not None:
            self.transport.close()


class Response:
    """A response as it arrives: the head (`status`, `headers`), then the body, by line (`line`) or whole (`read`).
    `release` gives a complete response's connection back to the pool; `close` drops it (the server sees the client
    leave)."""

    def __init__(self, connection: _Connection, silence: float) -> None:
        self.connection = connection
        self.silence = silence
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False
        self.keep_alive = False
        self.answered = False  # any byte of the answer has come
        self._parser = httptools.HttpResponseParser(self)
        self._body = bytearray()
        self._head_done = False
        self._draining = False  # released before its last bytes came: pooled when they have
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._last_byte = time.monotonic()
        self._watchdog: asyncio.TimerHandle | None = self._loop.call_later(silence, self._check_silence)

    # --- what the connection hands in -----------------------------------------------------------------------------

    def received(self, data: bytes) -> None:
        self._last_byte = time.monotonic()
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamDisconnected(f"the response could not be read: {exc}"))
            self.connection.close()
        if self._draining and (self.complete or not self._fit_for_reuse()):
            self._drained()
        self._wake()

    def lost(self, exc: Exception | None) -> None:
        if self._draining:
            self._stop_watchdog()
        if not self.complete and self._error is None:
            why = f": {exc}" if exc else ""
            self._fail(UpstreamDisconnected(f"the server closed the connection{why}"))
        self._wake()

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self._head_done = True

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.complete = True
        self._stop_watchdog()

    # --- what the gateway asks -------------------------------------------------------------------------------------

    async def head(self) -> None:
        """Wait for the status line and headers."""
        while not self._head_done:
            await self._wait()

    async def line(self) -> bytes:
        """The body's next line with its newline (the last may lack one); b"" at the end of the body."""
        while True:
            end = self._body.find(b"\n")
            if end >= 0:
                line = bytes(self._body[: end + 1])
                del self._body[: end + 1]
                return line
            if self.complete:
                rest = bytes(self._body)
                self._body.clear()
                return rest
            await self._wait()

    async def read(self) -> bytes:
        """The whole body."""
        while not self.complete:
            await self._wait()
        body = bytes(self._body)
        self._body.clear()
        return body

    def release(self) -> None:
        """Done with it: a kept-alive connection goes back to the pool once its response is complete; otherwise it is
        closed. What is left unread may only be blank (an event stream's last line ends its event: a reader that stops
        at `data: [DONE]` leaves the blank line after it).

        A reader that stops at `data: [DONE]` usually releases the response before its last bytes (the blank line,
        the chunked body's last chunk) have come: llama-server writes them separately. Such a response drains: its
        connection joins the pool when they come, or is closed if anything else comes or nothing within
        DRAIN_SECONDS. Without this no streamed answer's connection was ever reused, and every request paid for a
        new connection (and the server's accept and hand-over to a thread) before its first token."""
        self._stop_watchdog()
        if self._fit_for_reuse() and not self.complete:
            self._draining = True
            self._watchdog = self._loop.call_later(DRAIN_SECONDS, self.close)
            return
        self._drained()

    def _fit_for_reuse(self) -> bool:
        return self.keep_alive and self._error is None and not self._body.strip() and not self.connection.closed

    def _drained(self) -> None:
        self._stop_watchdog()
        connection = self.connection
        connection.response = None
        if self.complete and self._fit_for_reuse():
            connection.pool.add(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Stop reading and close the connection."""
        self._stop_watchdog()
        self.connection.response = None
        self.connection.close()

    # --- waiting ---------------------------------------------------------------------------------------------------

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._stop_watchdog()

    def _check_silence(self) -> None:
        quiet = time.monotonic() - self._last_byte
        if quiet < self.silence:
            self._watchdog = self._loop.call_later(self.silence - quiet, self._check_silence)
            return
        self._watchdog = None
        self._fail(UpstreamSilent(f"no byte came for {self.silence:g} s"))
        self.connection.close()
        self._wake()

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Key, _Pool]] = weakref.WeakKeyDictionary()


def _pool(key: Key) -> _Pool:
    """This loop's connections to one server (a connection belongs to the loop that made it)."""
    pools = _pools.setdefault(asyncio.get_running_loop(), {})
    if key not in pools:
        pools[key] = _Pool(key)
    return pools[key]


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


async def _connect(pool: _Pool, within: float) -> _Connection:
    host, port, tls = pool.key
    loop = asyncio.get_running_loop()
    try:
        _, connection = await asyncio.wait_for(
            loop.create_connection(
                lambda: _Connection(pool),
                host,
                port,
                ssl=_tls() if tls else None,
                server_hostname=host if tls else None,
            ),
            within,
        )
    except TimeoutError:
        raise UpstreamConnectTimeout(f"connecting to {host}:{port} took longer than {within:g} s") from None
    except OSError as exc:
        raise UpstreamConnectError(f"{host}:{port}: {exc.strerror or exc}") from None
    return connection


async def post(url: str, body: bytes, headers: dict[str, str], connect_timeout: float, silence: float) -> Response:
    """POST `body` to `url` and return the response once its head has come. A kept-alive connection is reused when
    there is one; if it turns out closed before any byte of the answer (the server closed it as it was taken), the
    request is sent once more on a new connection. Raises UpstreamConnectError, UpstreamDisconnected or
    UpstreamSilent."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    key = (parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80), tls)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"POST {target} HTTP/1.1", f"Host: {parts.netloc}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    pool = _pool(key)
    pool.within = connect_timeout
    connection = pool.reused()
    if connection is not None:
        try:
            return await _exchange(connection, request, silence)
        except _Unanswered:
            pass
    return await _exchange(await _connect(pool, connect_timeout), request, silence)


async def _exchange(connection: _Connection, request: bytes, silence: float) -> Response:
    response = connection.response = Response(connection, silence)
    connection.carried = True
    assert connection.transport is not None
    connection.transport.write(request)
    try:
        await response.head()
    except UpstreamDisconnected:
        response.close()
        if not response.answered:
            raise _Unanswered("the server closed the connection before answering") from None
        raise
    except BaseException:
        response.close()
        raise
    return response
