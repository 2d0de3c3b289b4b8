"""A generation's events as Anthropic's Messages API answers them: one message object, or the stream of named events
(`message_start`, `content_block_start`/`_delta`/`_stop` per text or tool_use block, `message_delta` with the stop
reason and usage, `message_stop`); errors in Anthropic's shape. The events come through the same `Choice` the chat API
reads (text, and tool calls parsed out of it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from django.http import JsonResponse

from webapp.api.completions import Choice
from webapp.api.responses import choice_events
from webapp.gateway.errors import GatewayError
from webapp.gateway.gateway import RequestContext
from webapp.gateway.lifecycle import Turn

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(error: GatewayError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def error_response(error: GatewayError, ctx: RequestContext) -> JsonResponse:
    return JsonResponse(error_body(error), status=error.status, headers={**ctx.headers(), **error.headers})


def stop_reason(choice: Choice) -> str:
    if choice.parser.calls:
        return "tool_use"
    if stop_sequence(choice) is not None:
        return "stop_sequence"
    return {"length": "max_tokens", "cancelled": "end_turn"}.get(choice.finish_reason, "end_turn")


def stop_sequence(choice: Choice) -> str | None:
    """The request's stop sequence that ended the answer, when one did."""
    return choice.finished.stop_string if choice.finished is not None else None


def usage(turn: Turn) -> dict[str, int]:
    """Input and output tokens so far; the closing `message_delta` carries both, as Anthropic's API now does (an
    upstream model's prompt is counted only once its server reports usage, after `message_start`)."""
    return {"input_tokens": turn.usage.prompt_tokens, "output_tokens": turn.usage.completion_tokens}


def message(turn: Turn, choice: Choice) -> dict[str, Any]:
    """The whole answer: a text block (when there is text), then a tool_use block per call."""
    assert turn.ctx.route is not None
    text = choice.content
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments or "{}")}
        for c in choice.parser.calls
    ]
    return {
        "id": turn.request_id,
        "type": "message",
        "role": "assistant",
        "model": turn.ctx.route.id,
        "content": content,
        "stop_reason": stop_reason(choice),
        "stop_sequence": stop_sequence(choice),
        "usage": usage(turn),
    }


def event(name: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event, as Anthropic's SDK reads them."""
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n".encode()


class MessageStream:
    """The event sequence for one choice's pieces: a text block opened at the first text, a tool_use block per call
    (its arguments as input_json_delta), each closed before the next opens."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.index = -1
        self.open: str | None = None  # "text" or "tool_use": the block being written

    def start(self) -> bytes:
        assert self.turn.ctx.route is not None
        shell: dict[str, Any] = {
            "id": self.turn.request_id,
            "type": "message",
            "role": "assistant",
            "model": self.turn.ctx.route.id,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.turn.usage.prompt_tokens, "output_tokens": 0},
        }
        return event("message_start", {"message": shell})

    def _block(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open = kind
        return [*out, event("content_block_start", {"index": self.index, "content_block": block})]

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.index})]

    def text(self, text: str) -> list[bytes]:
        out = [] if self.open == "text" else self._block("text", {"type": "text", "text": ""})
        return [
            *out,
            event("content_block_delta", {"index": self.index, "delta": {"type": "text_delta", "text": text}}),
        ]

    def call(self, delta: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if "id" in delta:
            block = {"type": "tool_use", "id": delta["id"], "name": delta["function"]["name"], "input": {}}
            out = self._block("tool_use", block)
        arguments = delta["function"].get("arguments", "")
        if arguments:
            json_delta = {"type": "input_json_delta", "partial_json": arguments}
            out.append(event("content_block_delta", {"index": self.index, "delta": json_delta}))
        return out

    def finish(self, choice: Choice) -> list[bytes]:
        reason = {"stop_reason": stop_reason(choice), "stop_sequence": stop_sequence(choice)}
        out = self.close()
        out.append(event("message_delta", {"delta": reason, "usage": usage(self.turn)}))
        return [*out, event("message_stop", {})]


async def message_stream(turn: Turn, choice: Choice) -> AsyncIterator[bytes]:
    """The streamed answer; an error after the start is Anthropic's `error` event; the turn is settled in every
    case, and a client that leaves stops the model."""
    stream = MessageStream(turn)
    try:
        try:
            yield stream.start()
            async for _, piece in choice_events(turn, [choice]):
                if piece is None:
                    continue
                for out in stream.text(piece.text) if piece.text else []:
                    yield out
                for delta in piece.calls:
                    for out in stream.call(delta.as_delta()):
                        yield out
            for out in stream.finish(choice):
                yield out
        except Exception as exc:
            yield event("error", {"error": error_body(turn.fail(exc))["error"]})
    except (asyncio.CancelledError, GeneratorExit) as exc:
        turn.fail(exc)
        raise
    finally:
        await turn.settle()
