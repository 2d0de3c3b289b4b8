"""One request to an upstream model: the server it goes to, its stream read as trace events, the gateway's clocks.

`generate` tries the model's replicas (fewest in flight first), then its fallbacks, until one answers with its first
chunk: a refused connection, a timeout, a 5xx or 429, or a stream that ends before any chunk sends the request on
(`ROUNDTRIP_UPSTREAM_ATTEMPTS` servers at most); a 4xx is the request's own fault and is passed on. After the first
chunk the stream is the client's: a failure then ends it with an error, and the usage row says 502. A client that
leaves closes the upstream connection, which stops the upstream's generation.

`UpstreamGeneration` answers what the gateway's `Turn` asks of a local generation (`accepted`, `messages()`,
`cancel()`, `close()`), so every API surface, the page and the usage row work on it unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
from django.conf import settings

from inference.params import SamplingParams
from webapp.catalog import ModelRoute, Upstream, by_name
from webapp.gateway.client import ChoiceEvent
from webapp.gateway.errors import GatewayError
from webapp.gateway.upstream import connection, probe, replicas, request_body, stream_client, tokenizer
from webapp.gateway.upstream.chunks import ChunkReader
from webapp.metrics import metrics
from webapp.worker import wire

DRAIN_SECONDS = 2.0  # after the usage chunk, how long [DONE] may take


@dataclass
class Clock:
    """The gateway's own time on this request, and the upstream's as the gateway saw it (perf_counter seconds)."""

    arrived: float
    sent: float = 0.0  # the upstream request went out (the attempt that answered)
    first_token: float | None = None
    last_token: float | None = None
    chunks: int = 0
    chunk_seconds: float = 0.0  # upstream chunk in -> client chunk out, summed

    def timings(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gateway_request_ms": round((self.sent - self.arrived) * 1000, 3)}
        if self.chunks:
            out["gateway_chunk_ms"] = round(self.chunk_seconds / self.chunks * 1000, 4)
        if self.first_token is not None:
            out["upstream_ttft_ms"] = round((self.first_token - self.sent) * 1000, 3)
        return out


class UpstreamGeneration:
    """An upstream's stream for one request, once its first chunk has come (see `generate`)."""

    def __init__(self, route: ModelRoute, request_id: str, n: int, seed: int, clock: Clock) -> None:
        self.route = route
        self.request_id = request_id
        self.n = n
        self.seed = seed
        self.clock = clock
        self.attempts = replicas.Attempts(route)
        self.served_by: ModelRoute = route
        self.upstream: Upstream | None = None
        self.worker: str | None = None
        self.control: str | None = None
        self.accepted: wire.Accepted | None = None
        self.finished: wire.Finished | None = None
        self.finished_choices: dict[int, wire.Finished] = {}
        self.cancelled = False
        self.closed = False
        self._response: stream_client.Response | None = None
        self._first: dict[str, Any] | None = None
        self.reader = ChunkReader(n, 0.0, seed)
        self.tokenized: wire.Tokenized | None = None  # the prompt's tokens, for the page (see `generate`)
        self._gaps: list[float] = []  # the upstream's inter-token times, observed once the stream is done

    # --- before the first byte: choose, send, retry --------------------------------------------------------------

    async def start(self, path_and_body: Any) -> None:
        """Send to one server after another until one streams its first chunk; GatewayError when none does."""
        while (choice := self.attempts.next()) is not None:
            served, upstream = choice
            path, payload = path_and_body(upstream)
            why, status, retry_after = await self._try(upstream, path, payload)
            if why is None:
                self.served_by, self.upstream, self.worker = served, upstream, upstream.name
                replicas.succeeded(upstream)
                metrics.labelled(metrics.upstream_up, upstream.name).set(1)
                self.accepted = wire.Accepted(
                    request_id=self.request_id,
                    control="",
                    worker=upstream.name,
                    weights=f"upstream {upstream.model} at {upstream.url}",
                    prompt_tokens=len(self.tokenized.ids) if self.tokenized else 0,
                    seed=self.seed,
                    queued=time.perf_counter() - self.clock.sent,
                )
                return
            self.attempts.failed(served, upstream, why, status)
            replicas.failed(upstream, why, retry_after)
            metrics.labelled(metrics.upstream_failures, upstream.name, "status" if status else _kind(why)).inc()
            metrics.labelled(metrics.upstream_retries, upstream.name).inc()
            metrics.labelled(metrics.upstream_up, upstream.name).set(0)
        raise connection.exhausted(self.route.id, self.attempts.tried)

    async def _try(
        self, upstream: Upstream, path: str, payload: dict[str, Any]
    ) -> tuple[str | None, int | None, float | None]:
        """(None, None, None) once `upstream` sent its first chunk; else why it failed, its status, its Retry-After."""
        state = replicas.state(upstream)
        state.in_flight += 1
        metrics.labelled(metrics.upstream_in_flight, upstream.name).inc()
        self.clock.sent = time.perf_counter()
        self.reader.sent = self.clock.sent
        try:
            response = await stream_client.post(
                upstream.url + path,
                msgspec.json.encode(payload),
                connection.headers(upstream, self.request_id),
                settings.ROUNDTRIP_UPSTREAM_CONNECT_TIMEOUT,
                settings.ROUNDTRIP_UPSTREAM_TIMEOUT,
            )
        except connection.FAILURES as exc:
            self._leave(upstream)
            return connection.why(exc), None, None
        if response.status != 200:
            try:
                body = await response.read()
            except connection.FAILURES:
                body = b""
            response.release()
            self._leave(upstream)
            if response.status in connection.RETRYABLE:
                message, _, _ = connection.upstream_message(body)
                retry_after = _seconds(response.headers.get("retry-after"))
                return f"HTTP {response.status}: {message}", response.status, retry_after
            metrics.labelled(metrics.upstream_requests, upstream.name, "refused").inc()
            raise connection.refused(upstream, response.status, body)
        self._response = response
        self.upstream = upstream
        try:
            first = await self._read()
        except GatewayError as exc:
            await self._drop()
            return exc.message, None, None
        if first is None:
            await self._drop()
            return "the stream ended before its first chunk", None, None
        self._first = first
        return None, None, None

    async def _drop(self) -> None:
        upstream = self.upstream
        if self._response is not None:
            self._response.close()
        self._response = None
        self.upstream = None
        if upstream is not None:
            self._leave(upstream)

    @staticmethod
    def _leave(upstream: Upstream) -> None:
        replicas.state(upstream).in_flight -= 1
        metrics.labelled(metrics.upstream_in_flight, upstream.name).dec()

    # --- the stream ---------------------------------------------------------------------------------------------

    async def _read(self) -> dict[str, Any] | None:
        """The next chunk (None at the end: [DONE], or the connection closed cleanly); GatewayError when the
        connection breaks, the upstream goes silent, or it sends an error."""
        assert self._response is not None and self.upstream is not None
        response = self._response
        try:
            while line := await response.line():
                field, _, data = line.partition(b":")
                data = data.strip()
                if field == b"error":
                    raise connection.broken(self.upstream, f"it sent an error: {_message(data)}")
                if field != b"data":
                    continue  # blank lines, comments, event names
                if data == b"[DONE]":
                    return None
                try:
                    chunk = _json(data)
                except msgspec.DecodeError:
                    raise connection.broken(self.upstream, f"it sent a line that is not JSON: {line[:200]!r}") from None
                if isinstance(chunk, dict):
                    if "error" in chunk:
                        raise connection.broken(self.upstream, f"it sent an error: {_message(data)}")
                    return chunk
            return None
        except connection.FAILURES as exc:
            raise connection.broken(self.upstream, connection.why(exc)) from None

    async def messages(self) -> AsyncIterator[wire.Waiting | ChoiceEvent]:
        """Each choice's trace events as the upstream's chunks come; GatewayError when the stream breaks."""
        with self._streaming() as upstream:
            if self.tokenized is not None:
                yield ChoiceEvent(0, self.tokenized)
            chunk, self._first = self._first, None
            while chunk is not None:
                arrived = time.perf_counter()
                for index, event in self.reader.read(chunk, arrived):
                    if isinstance(event, wire.Sampled) and self._tokens_seen(arrived):
                        metrics.labelled(metrics.upstream_ttft, upstream.name).observe(arrived - self.clock.sent)
                    yield ChoiceEvent(index, event)
                self.clock.chunks += 1
                self.clock.chunk_seconds += time.perf_counter() - arrived
                chunk = await self._next_after(self.reader.done)
            for index, event in self._finish(upstream):
                yield ChoiceEvent(index, event)

    async def relayed(self) -> AsyncIterator[dict[str, Any]]:
        """The upstream's chunks as it sent them, for a client that asked the same API and a turn nobody watches
        (`Turn.relayable`): the same clocks, counts and end as `messages`, without a trace event per token. Every
        token passes here while the upstream computes the next one on the same cores; the events, the choices and the
        chunks rebuilt from them cost a fifth of the gateway's CPU time per token (benchmarks/bench_gateway.py)."""
        with self._streaming() as upstream:
            chunk, self._first = self._first, None
            while chunk is not None:
                arrived = time.perf_counter()
                if self.reader.note(chunk, arrived) and self._tokens_seen(arrived):
                    metrics.labelled(metrics.upstream_ttft, upstream.name).observe(arrived - self.clock.sent)
                yield chunk
                self.clock.chunks += 1
                self.clock.chunk_seconds += time.perf_counter() - arrived
                chunk = await self._next_after(self.reader.done)
            self._finish(upstream)

    def _finish(self, upstream: Upstream) -> list[tuple[int, wire.Finished]]:
        """Each choice's Finished event, once the stream has ended; GatewayError when it ended before the answer."""
        if not self.reader.finished_all:
            raise connection.broken(upstream, "the stream ended before the answer did")
        out = []
        for index, event in self.reader.finish(time.perf_counter()):
            assert isinstance(event, wire.Finished)
            self.finished_choices[index] = event
            out.append((index, event))
        self.finished = self.finished_choices.get(0, out[-1][1] if out else None)
        return out

    @contextlib.contextmanager
    def _streaming(self) -> Iterator[Upstream]:
        """Around reading the stream: the upstream marked failed when it breaks, its request counted by outcome, the
        gateway's clocks observed, the connection given back or closed."""
        upstream = self.upstream
        assert upstream is not None, "start first"
        outcome = "cancelled"
        try:
            yield upstream
            outcome = "ok"
        except GatewayError as exc:
            outcome = "error"
            replicas.failed(upstream, exc.message)
            metrics.labelled(metrics.upstream_failures, upstream.name, "mid_stream").inc()
            metrics.labelled(metrics.upstream_up, upstream.name).set(0)
            raise
        finally:
            metrics.labelled(metrics.upstream_requests, upstream.name, outcome).inc()
            if self.clock.chunks:  # once a request: its mean (a histogram observed per chunk cost 3 % of a chunk)
                metrics.labelled(metrics.upstream_gateway_chunk, upstream.name).observe(
                    self.clock.chunk_seconds / self.clock.chunks
                )
            if outcome == "ok":
                replicas.state(upstream).served += 1
            self._observe_gaps(upstream)
            self.close()

    async def _next_after(self, done: bool) -> dict[str, Any] | None:
        """The next chunk; once the answer and its usage are in, only a short wait for the [DONE] after them (read to
        the end, the connection goes back to the pool for the next request)."""
        if not done:
            return await self._read()
        try:
            return await asyncio.wait_for(self._read(), DRAIN_SECONDS)
        except TimeoutError:
            return None

    def _tokens_seen(self, t: float) -> bool:
        """Count a token's arrival; True for the first one."""
        first = self.clock.first_token is None
        if first:
            self.clock.first_token = t
        elif self.clock.last_token is not None and t > self.clock.last_token:
            self._gaps.append(t - self.clock.last_token)
        self.clock.last_token = t
        return first

    def _observe_gaps(self, upstream: Upstream) -> None:
        """The inter-token histogram gets this stream's gaps once it is over: observed per token, its lock and bucket
        search ran on every token's path while the upstream, on the same cores, computed the next one."""
        if self._gaps:
            histogram = metrics.labelled(metrics.upstream_itl, upstream.name)
            for gap in self._gaps:
                histogram.observe(gap)
            self._gaps.clear()

    def extra_timings(self) -> dict[str, Any]:
        """For `roundtrip_timings`: which server answered, after which failures, the gateway's own time, and the
        upstream's own account of its time where it sends one (llama-server's `timings`)."""
        out = self.clock.timings() | {"upstream": self.worker, "upstream_model": self.served_by.id}
        if self.reader.server_timings:
            out["upstream_reported"] = self.reader.server_timings
        if self.attempts.tried:
            out["retried"] = [f"{t['upstream']}: {t['error']}" for t in self.attempts.tried]
        return out

    def routing(self) -> dict[str, Any]:
        """The routing decision, as the page draws it: the server that answered and the ones tried before."""
        assert self.upstream is not None
        return {
            "model": self.served_by.id,
            "upstream": self.upstream.name,
            "url": self.upstream.url,
            "upstream_model": self.upstream.model,
            "replicas": [r.name for r in self.route.replicas],
            "tried": self.attempts.tried,
        }

    async def next_token(self) -> None:
        """Step mode is refused for upstream models (see `request_body`): nothing to release."""

    async def cancel(self) -> None:
        """The client left: close the connection, which tells the upstream to stop."""
        if self._response is not None and self.finished is None:
            self.cancelled = True
            self._response.close()

    def close(self) -> None:
        """Give the connection back (read to its end) or close it (cut short), and this request's place."""
        if self.closed:
            return
        self.closed = True
        if self._response is not None:
            self._response.release() if self.finished is not None else self._response.close()
        if self.upstream is not None:
            self._leave(self.upstream)


async def _tokenized(
    route: ModelRoute, messages: list[dict[str, Any]], prompt: str | None, tools: list[dict[str, Any]] | None
) -> wire.Tokenized | None:
    """The prompt as the upstream tokenizes it (its chat template applied by the upstream), or None when the
    upstream exposes no tokenizer: the page then says so instead of guessing with another model's."""
    started = time.perf_counter()
    try:
        if prompt is not None:
            found = await tokenizer.tokenize(route, text=prompt)
        else:
            found = await tokenizer.tokenize(route, messages=messages, tools=tools)
    except GatewayError:
        return None
    now = time.perf_counter()
    return wire.Tokenized(
        t=now,
        duration=now - started,
        text=found.text if found.text is not None else prompt or "",
        ids=found.ids,
        spans=found.spans,
        tokens=found.tokens,
        pieces=found.tokens,
        tokenizer="the upstream's own",
    )


def local_fallback(route: ModelRoute, failure: GatewayError) -> ModelRoute | None:
    """The first model this deployment runs among `route`'s fallbacks, when every upstream server failed before the
    first byte (`failure` is that refusal): the request is answered here instead."""
    if failure.code not in connection.EXHAUSTED:
        return None
    names = by_name()
    return next((names[f] for f in route.fallback if f in names and not names[f].upstream), None)


_json = msgspec.json.Decoder().decode  # a chunk a line: msgspec's decoder, a third of json.loads' time


def _message(data: bytes) -> str:
    message, _, _ = connection.upstream_message(data)
    return message


def _kind(why: str) -> str:
    return "timeout" if why.startswith("timed out") else "connect" if why.startswith("could not") else "stream"


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


async def generate(
    route: ModelRoute,
    messages: list[dict[str, Any]],
    params: SamplingParams,
    level: str,
    request_id: str,
    arrived: float,
    passthrough: dict[str, Any] | None = None,
    **options: Any,
) -> UpstreamGeneration:
    """Start `route`'s generation on the first upstream server that streams (see the module's docstring)."""
    probe.ensure_running()
    generation = UpstreamGeneration(route, request_id, options.get("n", 1), params.seed or 0, Clock(arrived))
    if level != "off":  # the page watches: the prompt's tokens by the upstream's own tokenizer, where it has one
        generation.tokenized = await _tokenized(route, messages, options.get("prompt"), options.get("tools"))

    def path_and_body(upstream: Upstream) -> tuple[str, dict[str, Any]]:
        return request_body.body(upstream, messages, params, level, passthrough, **options)

    try:
        await generation.start(path_and_body)
    except BaseException:
        await generation.cancel()
        generation.close()
        raise
    assert generation.upstream is not None
    metrics.labelled(metrics.upstream_gateway_request, generation.upstream.name).observe(
        generation.clock.sent - arrived
    )
    return generation
