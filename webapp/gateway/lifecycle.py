"""One request's life in the gateway, the same for the API, the page and the benchmark:
authenticate → limit → route → generate → settle → usage row.

A `Turn` is created when a request arrives and settled exactly once, whatever happened: the
generation is stopped if it still runs, the usage row is written with what was used (prompt
tokens once, every choice's completion tokens), and observers hear of it. Interfaces call it and
only translate: the API into JSON and SSE, the page into WebSocket frames. Failures become one
`GatewayError` via `fail`, so an unexpected exception is a 500 `server_error` (logged here with its
traceback, never shown to the client), not a crash or a silent stream.

Observers (the gateway's metrics, the page's staff watch) subscribe with `observe`; they hear every turn about to
generate (and may ask for its trace then), start, every trace event and every settlement. The gateway knows nothing
of who they are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from asgiref.sync import sync_to_async

from inference.params import SamplingParams
from webapp.catalog import ModelRoute
from webapp.gateway import cache_calls, client
from webapp.gateway.errors import GatewayError
from webapp.gateway.gateway import RequestContext, Stage, limit_and_route, record_usage
from webapp.gateway.identity import Identity, renew
from webapp.gateway.upstream import generation as upstream
from webapp.usage.models import UsageRecord
from webapp.worker import wire

log = logging.getLogger("roundtrip.gateway")


class Observer(Protocol):
    async def starting(self, turn: Turn) -> None:
        """The turn is about to generate: an observer that needs its trace asks with `turn.trace_at_least`."""

    async def started(self, turn: Turn) -> None: ...

    async def event(self, turn: Turn, index: int, event: wire.TraceEvent) -> None: ...

    async def settled(self, turn: Turn, record: UsageRecord) -> None: ...


_observers: list[Observer] = []


def observe(observer: Observer) -> None:
    """Hear about every turn from now on (apps register theirs in `ready()`)."""
    if observer not in _observers:
        _observers.append(observer)


def unobserve(observer: Observer) -> None:
    """Stop hearing about turns."""
    if observer in _observers:
        _observers.remove(observer)


def observers() -> tuple[Observer, ...]:
    """Who hears about turns now."""
    return tuple(_observers)


@dataclass
class Usage:
    """What a turn used so far: from the finished events when there are any, else counted as tokens come."""

    prompt_tokens: int = 0
    sampled: dict[int, int] = field(default_factory=dict)  # choice -> tokens drawn
    finished: dict[int, wire.Finished] = field(default_factory=dict)  # choice -> its finished event
    first_token_at: float | None = None

    def count(self, index: int, event: wire.TraceEvent) -> None:
        if isinstance(event, wire.Sampled):
            self.sampled[index] = self.sampled.get(index, 0) + 1
            if self.first_token_at is None:
                self.first_token_at = time.perf_counter()
        elif isinstance(event, wire.Finished):
            self.finished[index] = event
            self.prompt_tokens = event.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(self.finished[i].completion_tokens if i in self.finished else n for i, n in self.sampled.items())

    @property
    def cached_tokens(self) -> int:
        first = self.finished.get(0)
        return first.cached_tokens if first else 0

    def as_openai(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@functools.lru_cache(maxsize=64)
def _fingerprint(model: str, weights: str) -> str:
    return "fp_" + hashlib.sha256(f"{model}|{weights}".encode()).hexdigest()[:12]


ID_PREFIXES = {"completions": "cmpl-", "messages": "msg_", "responses": "resp_"}  # ids as each API writes them


class Turn:
    def __init__(self, endpoint: str, client_ip: str | None, stream: bool = False) -> None:
        prefix = ID_PREFIXES.get(endpoint, "chatcmpl-")
        self.ctx = RequestContext(client.new_request_id(prefix), endpoint, client_ip, stream=stream)
        self.generation: client.Generation | upstream.UpstreamGeneration | None = None
        self.usage = Usage()
        self.status, self.error_code = 200, ""
        self.record: UsageRecord | None = None
        self.level: wire.Level = "off"  # how much of its trace the worker sends
        self._fingerprint: str | None = None

    @property
    def request_id(self) -> str:
        return self.ctx.request_id

    def authenticated(self, identity: Identity, started: float) -> Identity:
        """Stage 1 done (the interface knows how: key, session): who it is, and how long that took."""
        self.ctx.identity = identity
        self.ctx.timed("authenticate", started, who=identity.label)
        return identity

    async def admit(self, model: str) -> ModelRoute:
        """Stages 2 and 3: rate limits and budgets, then the model; GatewayError when refused. The counters live in
        Django's cache (`cache_calls` says where they are counted)."""
        assert self.ctx.identity is not None, "authenticate first"
        await cache_calls.call(limit_and_route, self.ctx, self.ctx.identity, model)
        assert self.ctx.route is not None
        return self.ctx.route

    async def generate(
        self,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        level: wire.Level = "off",
        passthrough: dict[str, Any] | None = None,
        **options: Any,
    ) -> client.Generation | upstream.UpstreamGeneration:
        """Stage 4 begins: the worker (or the upstream server) accepted the request (or GatewayError); observers hear
        of it.

        `level` is what the interface asks of the trace; an observer may ask for more (`trace_at_least`) as the turn
        starts. The answer is the same either way: interfaces read only the events they always get. `passthrough`
        holds request fields an upstream server is given as the client sent them (a JSON answer's format, the tool
        choice); a local model has them in `params` already."""
        route = self.ctx.route
        assert route is not None, "admit first"
        self.level = level
        for observer in _observers:
            await observer.starting(self)
        if route.upstream:
            started = time.perf_counter()
            try:
                self.generation = await upstream.generate(
                    route, messages, params, self.level, self.ctx.request_id, self.ctx.started, passthrough, **options
                )
            except GatewayError as exc:
                local = upstream.local_fallback(route, exc)
                if local is None:
                    raise
                self.ctx.timed("upstream", started, model=local.id, upstream="", failed=exc.message)
                self.generation = await client.generate(
                    local, messages, params, self.level, self.ctx.request_id, **options
                )
            else:
                # the stage is the gateway's own time: choosing, retrying and sending, not the upstream's first token
                sent = self.generation.clock.sent
                self.ctx.stages.append(Stage("upstream", sent - started, self.generation.routing()))
        else:
            self.generation = await client.generate(route, messages, params, self.level, self.ctx.request_id, **options)
        accepted = self.generation.accepted
        self.usage.prompt_tokens = accepted.prompt_tokens if accepted else 0
        self.ctx.worker = self.generation.worker or ""
        for observer in _observers:
            await observer.started(self)
        return self.generation

    def upstream_timings(self) -> dict[str, Any]:
        """For an upstream model's turn: which server answered, after which failures, and the gateway's own time."""
        if isinstance(self.generation, upstream.UpstreamGeneration):
            return self.generation.extra_timings()
        return {}

    def trace_at_least(self, level: wire.Level) -> None:
        """Before the turn generates: have the worker send at least this much of the trace."""
        order: tuple[wire.Level, ...] = ("off", "summary", "full")
        if order.index(level) > order.index(self.level):
            self.level = level

    def gateway_report(self) -> dict[str, Any]:
        """What the gateway did, as the pipeline page shows it: who, which model on which channel, the limits and the
        rate-limit bucket before and after, and each check with its time."""
        ctx = self.ctx
        assert ctx.identity is not None and ctx.route is not None and ctx.rate is not None, "admit first"
        return {
            "identity": ctx.identity.label,
            "model": ctx.route.id,
            "channel": ctx.route.work_channel,
            "prices": {"input_per_million": ctx.route.input_price, "output_per_million": ctx.route.output_price},
            "limits": dataclasses.asdict(ctx.identity.limits),
            "rate": ctx.rate.counted,
            "stages": [{"name": s.name, "ms": s.seconds * 1000, "detail": s.detail} for s in ctx.stages],
        }

    def usage_report(self) -> dict[str, Any]:
        """The settled turn's usage row and the gateway's checks with their times, as the pipeline page shows them."""
        record = self.record
        assert record is not None, "settle first"
        return {
            "record": {
                "id": record.pk,
                "request_id": record.request_id,
                "status": record.status,
                "finish_reason": record.finish_reason,
                "prompt_tokens": record.prompt_tokens,
                "completion_tokens": record.completion_tokens,
                "ttft_ms": record.ttft_ms,
                "total_ms": record.total_ms,
                "model": record.model,
                "cost_usd": record.cost_usd,
            },
            "stages": [{"name": s.name, "ms": s.seconds * 1000} for s in self.ctx.stages],
        }

    async def messages(self) -> AsyncIterator[wire.Waiting | client.ChoiceEvent]:
        """The worker's replies until the end ("waiting" updates and each choice's events), counted for the usage
        row."""
        assert self.generation is not None, "generate first"
        async for message in self.generation.messages():
            if isinstance(message, client.ChoiceEvent):
                self.usage.count(message.index, message.event)
                for observer in _observers:
                    await observer.event(self, message.index, message.event)
            yield message
        if self.generation.cancelled:
            self.status, self.error_code = 499, "cancelled"

    @property
    def relayable(self) -> bool:
        """Whether the upstream's chunks may go to the client as they came (`relayed`): an upstream model's turn whose
        trace nobody asked for. An observer that wants a turn's events asks for its trace as it starts
        (`trace_at_least`), so such a turn has none for it."""
        return isinstance(self.generation, upstream.UpstreamGeneration) and self.level == "off"

    async def relayed(self) -> AsyncIterator[dict[str, Any]]:
        """A relayable turn's upstream chunks, as they came, counted for the usage row as `messages` counts events."""
        generation = self.generation
        assert isinstance(generation, upstream.UpstreamGeneration) and self.relayable, "only a relayable turn"
        choices = generation.reader.choices
        async for chunk in generation.relayed():
            for index, choice in choices.items():
                self.usage.sampled[index] = choice.tokens
            if self.usage.first_token_at is None and generation.clock.first_token is not None:
                self.usage.first_token_at = time.perf_counter()
            yield chunk
        for index, finished in sorted(generation.finished_choices.items()):
            self.usage.count(index, finished)
        if generation.cancelled:
            self.status, self.error_code = 499, "cancelled"

    def fail(self, exc: BaseException) -> GatewayError:
        """The turn ends in an error: which one to show. A client that left is 499; anything unexpected is logged
        here and shown as a plain 500, without the exception's text."""
        if isinstance(exc, GatewayError):
            error = exc
        elif isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            error = GatewayError(
                499, "The client closed the request.", "invalid_request_error", "client_closed_request"
            )
        else:
            log.error("request %s failed", self.request_id, exc_info=exc)
            error = GatewayError(
                500,
                f"The server failed while handling this request (request id {self.request_id}).",
                "server_error",
                "server_error",
            )
        self.status, self.error_code = error.status, error.code or error.type
        return error

    @property
    def finish_reason(self) -> str:
        if self.status == 499:
            return "cancelled"
        if self.status != 200:
            return "error"
        if self.generation is None:  # not a generation (tokenize, detokenize)
            return ""
        first = self.usage.finished.get(0)
        return first.finish_reason if first else "cancelled"

    @property
    def fingerprint(self) -> str | None:
        """OpenAI's system_fingerprint: which model file in which weight format answered; a seed reproduces a
        result only under the same fingerprint. (Every streamed chunk carries it: worked out once per turn.)"""
        if self._fingerprint is None:
            if self.generation is None or self.generation.accepted is None or self.ctx.route is None:
                return None
            self._fingerprint = _fingerprint(self.ctx.route.id, self.generation.accepted.weights)
        return self._fingerprint

    async def settle(self) -> UsageRecord:
        """Stage 5, exactly once: stop what still runs, write the usage row, tell the observers."""
        if self.record is not None:
            return self.record
        generation = self.generation
        if generation is not None:
            if generation.finished is None:
                await asyncio.shield(generation.cancel())
            generation.close()
        ttft = None if self.usage.first_token_at is None else self.usage.first_token_at - self.ctx.started
        self.record = await asyncio.shield(
            _write_usage_row(
                self.ctx,
                self.status,
                self.finish_reason,
                self.error_code,
                self.usage.prompt_tokens,
                self.usage.completion_tokens,
                ttft,
                self.usage.cached_tokens,
            )
        )
        for observer in _observers:
            await observer.settled(self, self.record)
        return self.record


def _usage_row(ctx: RequestContext, *args: Any) -> UsageRecord:
    """The settled turn's usage row, and, on the same thread, its key's renewal in the key cache (`renew`): after the
    answer, so the next request does not wait for the database."""
    record = record_usage(ctx, *args)
    if ctx.identity is not None:
        renew(ctx.identity)
    return record


_write_usage_row = sync_to_async(_usage_row)  # made once: asgiref inspects the function on every wrapping
