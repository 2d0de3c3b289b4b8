"""How a generation's events become an HTTP response: one JSON object when every choice has finished, or an SSE stream
that always ends (an error after the start becomes an error event, then [DONE]), with the turn settled in every case."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from django.http import HttpResponse, JsonResponse

from webapp.api.completions import Choice, Piece, chunk, sse, text_chunk, timings
from webapp.api.protocol import ChatCompletionRequest, CompletionRequest
from webapp.gateway import client
from webapp.gateway.errors import GatewayError
from webapp.gateway.gateway import RequestContext
from webapp.gateway.lifecycle import Turn


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


async def guarded_sse(turn: Turn, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """An SSE stream that always ends: an error after the start becomes an error event, then [DONE]; a client that
    leaves stops the model within one token; the turn is settled in every case."""
    try:
        try:
            async for event in events:
                yield event
        except Exception as exc:
            yield sse(turn.fail(exc).body())
        yield sse("[DONE]")
    except (asyncio.CancelledError, GeneratorExit) as exc:
        turn.fail(exc)
        raise
    finally:
        await turn.settle()


class ChatChunks:
    """Chat chunks exactly as OpenAI's clients read them, one choice's piece at a time: per choice, the role chunk with
    its first output, content and tool_calls deltas, then its finish chunk; the usage chunk last when asked for. The
    API streams them; the page replays a turn's events through the same chunker to show what a client received."""

    def __init__(self, turn: Turn, logprobs: bool, include_usage: bool, continuous_usage: bool = False) -> None:
        self.turn = turn
        self.logprobs = logprobs
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.created = int(time.time())
        self.started: set[int] = set()
        self.done: set[int] = set()

    def _opened(self, choice: Choice) -> list[bytes]:
        if choice.index in self.started:
            return []
        self.started.add(choice.index)
        delta = {"role": "assistant", "content": ""}
        logprobs: list[dict[str, Any]] | None = [] if self.logprobs else None
        return [sse(chunk(self.turn, self.created, delta, logprobs=logprobs, index=choice.index))]

    def feed(self, choice: Choice, piece: Piece | None) -> list[bytes]:
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


def chat_stream(turn: Turn, body: ChatCompletionRequest, choices: list[Choice]) -> AsyncIterator[bytes]:
    """The chat SSE stream of a turn (`ChatChunks`), guarded to always end."""
    chunks = ChatChunks(turn, bool(body.logprobs), body.include_usage, body.continuous_usage)

    async def events() -> AsyncIterator[bytes]:
        # What one event releases goes out in one write: the first token's text goes with the role chunk before it,
        # not a write (and a wake of the client) later.
        async for choice, piece in choice_events(turn, choices):
            if out := chunks.feed(choice, piece):
                yield b"".join(out)
        if out := chunks.end():
            yield b"".join(out)

    return guarded_sse(turn, events())


def text_stream(turn: Turn, body: CompletionRequest, choices: list[Choice], echo: str) -> AsyncIterator[bytes]:
    created = int(time.time())

    async def events() -> AsyncIterator[bytes]:
        if echo:
            for choice in choices:
                yield sse(text_chunk(turn, created, choice, Piece(echo, []), body.logprobs))
        async for choice, piece in choice_events(turn, choices):
            if piece is not None and (piece.text or piece.logprobs):
                yield sse(text_chunk(turn, created, choice, piece, body.logprobs))
            if choice.finished is not None and choice.index not in done:
                done.add(choice.index)
                yield sse(text_chunk(turn, created, choice, Piece("", []), body.logprobs, choice.finish_reason))
        if body.include_usage:
            yield sse(
                {
                    "id": turn.request_id,
                    "object": "text_completion",
                    "created": created,
                    "model": turn.ctx.route.id if turn.ctx.route else "",
                    "choices": [],
                    "usage": turn.usage.as_openai(),
                }
            )

    done: set[int] = set()
    return guarded_sse(turn, events())
