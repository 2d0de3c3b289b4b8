"""How a generation's events become an HTTP response: one JSON object when every choice has finished, or an SSE stream
that always ends (an error after the start becomes an error event, then [DONE]), with the turn settled in every case."""

from __future__ import annotations

import abc
import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

import msgspec
from django.http import HttpResponse, JsonResponse

from webapp.api.completions import Choice, Piece, chunk, sse, text_chunk, timings
from webapp.api.protocol import ChatCompletionRequest, CompletionRequest
from webapp.gateway import client
from webapp.gateway.errors import GatewayError
from webapp.gateway.gateway import RequestContext
from webapp.gateway.lifecycle import Turn
from webapp.worker import wire

Item = TypeVar("Item")
Fed = TypeVar("Fed", contravariant=True)


def error_response(exc: GatewayError, ctx: RequestContext | None = None) -> JsonResponse:
    headers = {**(ctx.headers() if ctx else {}), **exc.headers}
    return JsonResponse(exc.body(), status=exc.status, headers=headers)


async def complete(turn: Turn, choices: list[Choice], answer: Callable[[int], dict[str, Any]]) -> HttpResponse:
    """Collect every choice, then answer with the whole object; the turn is settled whatever happens."""
    try:
        async for message in turn.messages():
            if isinstance(message, client.ChoiceEvent):
                choices[message.index].feed(message.event)
        result = answer(int(time.time()))
        return JsonResponse(result, headers={**turn.ctx.headers(), "x-roundtrip-timings": json.dumps(timings(turn))})
    except asyncio.CancelledError as exc:  # the client left: stop the model
        turn.fail(exc)
        raise
    except Exception as exc:
        return error_response(turn.fail(exc), turn.ctx)
    finally:
        await turn.settle()


async def choice_events(turn: Turn, choices: list[Choice]) -> AsyncIterator[tuple[Choice, Piece | None]]:
    """(choice, what it has to send) for every event; the piece is None when there is nothing to send."""
    async for message in turn.messages():
        if isinstance(message, client.ChoiceEvent):
            choice = choices[message.index]
            yield choice, choice.feed(message.event)


class ChunkWriter(Protocol[Fed]):
    """One API's SSE events for a streamed turn: before the first item, for each item of the turn's stream, after the
    last."""

    def start(self) -> list[bytes]: ...

    def feed(self, item: Fed) -> list[bytes]: ...

    def end(self) -> list[bytes]: ...


async def guarded_sse(turn: Turn, items: AsyncIterator[Item], writer: ChunkWriter[Item]) -> AsyncIterator[bytes]:
    """An SSE stream that always ends: an error after the start becomes an error event, then [DONE]; a client that
    leaves stops the model within one token; the turn is settled in every case.

    `items` is the turn's stream (its events, or an upstream's chunks relayed), which `writer` makes into the API's
    events; what one item releases goes out in one write (the first token's text with the role chunk before it, not a
    write and a wake of the client later). Every streamed token passes here while the upstream or the model computes
    the next one on the same cores: one generator between the turn and the socket, not three (each layer's
    resumption, with cold caches between tokens, cost more than its work)."""
    try:
        try:
            if out := writer.start():
                yield b"".join(out)
            async for item in items:
                if out := writer.feed(item):
                    yield b"".join(out)
            if out := writer.end():
                yield b"".join(out)
        except Exception as exc:
            yield sse(turn.fail(exc).body())
        yield sse("[DONE]")
    except (asyncio.CancelledError, GeneratorExit) as exc:
        turn.fail(exc)
        raise
    finally:
        await turn.settle()


class EventChunks(abc.ABC):
    """A writer of the turn's trace events: each choice's events through its `Choice`, whose pieces `pieces` makes
    into the API's events."""

    def __init__(self, choices: list[Choice]) -> None:
        self.choices = choices

    def feed(self, item: wire.Waiting | client.ChoiceEvent) -> list[bytes]:
        if not isinstance(item, client.ChoiceEvent):
            return []
        choice = self.choices[item.index]
        return self.pieces(choice, choice.feed(item.event))

    @abc.abstractmethod
    def pieces(self, choice: Choice, piece: Piece | None) -> list[bytes]:
        """The API's events for what one choice has to send now (None: nothing)."""


class ChatChunks(EventChunks):
    """Chat chunks exactly as OpenAI's clients read them, one choice's piece at a time: per choice, the role chunk with
    its first output, content and tool_calls deltas, then its finish chunk; the usage chunk last when asked for. The
    API streams them; the page replays a turn's events through the same chunker to show what a client received."""

    def __init__(
        self,
        turn: Turn,
        logprobs: bool,
        include_usage: bool,
        continuous_usage: bool = False,
        choices: list[Choice] | None = None,
    ) -> None:
        super().__init__(choices or [])
        self.turn = turn
        self.logprobs = logprobs
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.created = int(time.time())
        self.started: set[int] = set()
        self.done: set[int] = set()

    def start(self) -> list[bytes]:
        """Nothing before the first event: each choice opens with its role chunk."""
        return []

    def _opened(self, choice: Choice) -> list[bytes]:
        if choice.index in self.started:
            return []
        self.started.add(choice.index)
        delta = {"role": "assistant", "content": ""}
        logprobs: list[dict[str, Any]] | None = [] if self.logprobs else None
        return [sse(chunk(self.turn, self.created, delta, logprobs=logprobs, index=choice.index))]

    def pieces(self, choice: Choice, piece: Piece | None) -> list[bytes]:
        """The events for what one choice has to send now (`Choice.feed`'s piece, None when nothing)."""
        turn, created, out = self.turn, self.created, []
        if piece is not None:
            out += self._opened(choice)
            if piece.text or piece.logprobs:
                logprobs = piece.logprobs if self.logprobs else None
                content = chunk(turn, created, {"content": piece.text}, logprobs=logprobs, index=choice.index)
                if self.continuous_usage:
                    content["usage"] = turn.usage.as_openai()  # the running counts, as vLLM sends them
                out.append(sse(content))
            for call in piece.calls:  # one delta per chunk, as OpenAI sends them (instructor reads only the first)
                out.append(sse(chunk(turn, created, {"tool_calls": [call.as_delta()]}, index=choice.index)))
        if choice.finished is not None and choice.index not in self.done:
            self.done.add(choice.index)
            out += self._opened(choice)
            last = chunk(turn, created, {}, choice.finish_reason, index=choice.index, roundtrip_timings=timings(turn))
            out.append(sse(last))
        return out

    def end(self) -> list[bytes]:
        """After every choice: the usage chunk, when asked for."""
        if not self.include_usage:
            return []
        return [sse(chunk(self.turn, self.created, {}) | {"choices": [], "usage": self.turn.usage.as_openai()})]


class RelayedChatChunks:
    """An upstream's chat chunks as it sent them, under this gateway's envelope: its id, created time, model id and
    fingerprint, with only `choices` kept of the upstream's fields (its own extras, such as llama-server's `timings`,
    stay behind). A role chunk waits for the first output, to leave with it in one write; each choice's finish is held
    to the end, where it goes with `roundtrip_timings` as `ChatChunks` writes it (the upstream's usage comes after its
    finish); the usage chunk is this turn's, when asked for."""

    def __init__(self, turn: Turn, include_usage: bool) -> None:
        self.turn = turn
        self.include_usage = include_usage
        self.created = int(time.time())
        self.held: dict[int, str] = {}  # each choice's finish reason (its first), for the end
        self._head = b""  # the envelope's bytes up to its choices, once the turn's fingerprint is known
        self._before_output: list[bytes] | None = []  # events before the first output (the role chunk); None after

    def start(self) -> list[bytes]:
        return []

    def feed(self, item: dict[str, Any]) -> list[bytes]:
        """The chunk's choices, those that carry more than their finish, at once: one event."""
        choices = item.get("choices")
        if not isinstance(choices, list) or not choices:
            return []  # the upstream's usage chunk: this turn's own goes at the end
        sent = []
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            reason = choice.get("finish_reason")
            if not reason:
                sent.append(choice)
                continue
            self.held.setdefault(choice.get("index") or 0, reason)
            if _carries_output(choice):  # the last token and the finish in one chunk: the token now, the finish later
                sent.append(choice | {"finish_reason": None})
        if not sent:
            return []
        event = b"".join((self._envelope_head(), msgspec.json.encode(sent), b"}\n\n"))
        if self._before_output is None:
            return [event]
        if not any(_carries_output(choice) for choice in sent):
            self._before_output.append(event)
            return []
        out, self._before_output = [*self._before_output, event], None
        return out

    def end(self) -> list[bytes]:
        turn, created = self.turn, self.created
        out = [
            *(self._before_output or ()),
            *(
                sse(chunk(turn, created, {}, reason, index=index, roundtrip_timings=timings(turn)))
                for index, reason in self.held.items()
            ),
        ]
        if self.include_usage:
            out.append(sse(chunk(turn, created, {}) | {"choices": [], "usage": turn.usage.as_openai()}))
        return out

    def _envelope_head(self) -> bytes:
        """`data: {"id": ..., "choices":` as `chunk` writes it, encoded once a turn."""
        if not self._head:
            envelope = {k: v for k, v in chunk(self.turn, self.created, {}).items() if k != "choices"}
            self._head = b"data: " + msgspec.json.encode(envelope)[:-1] + b',"choices":'
        return self._head


def _carries_output(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    if isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content")):
        return True
    logprobs = choice.get("logprobs")
    return bool(choice.get("text")) or (isinstance(logprobs, dict) and bool(logprobs.get("content")))


def chat_stream(turn: Turn, body: ChatCompletionRequest, choices: list[Choice]) -> AsyncIterator[bytes]:
    """The chat SSE stream of a turn, guarded to always end: an upstream's chunks relayed as they came when the turn
    allows it (`Turn.relayable`) and the client asked nothing the gateway adds to each chunk; else `ChatChunks`."""
    if turn.relayable and not body.continuous_usage:
        return guarded_sse(turn, turn.relayed(), RelayedChatChunks(turn, body.include_usage))
    writer = ChatChunks(turn, bool(body.logprobs), body.include_usage, body.continuous_usage, choices)
    return guarded_sse(turn, turn.messages(), writer)


class TextChunks(EventChunks):
    """Legacy text completion chunks: the echoed prompt first when asked, each choice's text, its finish chunk, the
    usage chunk last when asked for."""

    def __init__(self, turn: Turn, body: CompletionRequest, choices: list[Choice], echo: str) -> None:
        super().__init__(choices)
        self.turn = turn
        self.body = body
        self.echo = echo
        self.created = int(time.time())
        self.done: set[int] = set()

    def start(self) -> list[bytes]:
        if not self.echo:
            return []
        piece = Piece(self.echo, [])
        return [sse(text_chunk(self.turn, self.created, c, piece, self.body.logprobs)) for c in self.choices]

    def pieces(self, choice: Choice, piece: Piece | None) -> list[bytes]:
        turn, created, logprobs, out = self.turn, self.created, self.body.logprobs, []
        if piece is not None and (piece.text or piece.logprobs):
            out.append(sse(text_chunk(turn, created, choice, piece, logprobs)))
        if choice.finished is not None and choice.index not in self.done:
            self.done.add(choice.index)
            out.append(sse(text_chunk(turn, created, choice, Piece("", []), logprobs, choice.finish_reason)))
        return out

    def end(self) -> list[bytes]:
        if not self.body.include_usage:
            return []
        turn = self.turn
        usage = {
            "id": turn.request_id,
            "object": "text_completion",
            "created": self.created,
            "model": turn.ctx.route.id if turn.ctx.route else "",
            "choices": [],
            "usage": turn.usage.as_openai(),
        }
        return [sse(usage)]


def text_stream(turn: Turn, body: CompletionRequest, choices: list[Choice], echo: str) -> AsyncIterator[bytes]:
    """The legacy completions SSE stream of a turn (`TextChunks`), guarded to always end."""
    return guarded_sse(turn, turn.messages(), TextChunks(turn, body, choices, echo))
