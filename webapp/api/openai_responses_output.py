"""A generation's events as OpenAI's Responses API answers them: one response object, or the stream of typed events
(`response.created`, `response.in_progress`, per output item `response.output_item.added` … `.done` with its text or
arguments deltas, then `response.completed` / `.incomplete` / `.failed`).

Both come from one `ResponseWriter` fed the same `Choice` pieces the chat API reads (text, and tool calls parsed out
of it): the streamed events and the whole object cannot disagree. A response with `store` is kept with its
conversation (`stored_responses`) when it ends, streamed or not.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async

from webapp.api import stored_responses
from webapp.api.completions import Choice, Piece
from webapp.api.openai_responses_protocol import ResponsesRequest
from webapp.api.protocol import ChatCompletionRequest
from webapp.api.responses import choice_events
from webapp.api.tool_calls import CallDelta
from webapp.gateway.errors import GatewayError
from webapp.gateway.lifecycle import Turn


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponseWriter:
    """The output items as they grow (a message item per run of text, a function_call item per call) and the events
    that say so; `response()` is the object as it stands."""

    def __init__(self, turn: Turn, body: ResponsesRequest, chat: ChatCompletionRequest) -> None:
        self.turn, self.body, self.chat = turn, body, chat
        self.created_at = int(time.time())
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being written
        self.status = "in_progress"
        self.error: GatewayError | None = None

    def _event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    def start(self) -> list[bytes]:
        shell = self.response()
        return [self._event("response.created", response=shell), self._event("response.in_progress", response=shell)]

    def _add(self, item: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.items.append(item)
        self.open = item
        return [*out, self._event("response.output_item.added", output_index=len(self.items) - 1, item=item)]

    def _where(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.items) - 1}

    def text(self, piece: Piece) -> list[bytes]:
        out: list[bytes] = []
        if self.open is None or self.open["type"] != "message":
            message = {"id": _item_id("msg"), "type": "message", "status": "in_progress", "role": "assistant"}
            out += self._add({**message, "content": []})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self.open["content"].append(part)  # type: ignore[index]
            out.append(self._event("response.content_part.added", **self._where(), content_index=0, part=part))
        assert self.open is not None
        part = self.open["content"][0]
        part["text"] += piece.text
        part["logprobs"] += piece.logprobs
        delta = {"delta": piece.text, "logprobs": piece.logprobs}
        return [*out, self._event("response.output_text.delta", **self._where(), content_index=0, **delta)]

    def call(self, delta: CallDelta) -> list[bytes]:
        out: list[bytes] = []
        if delta.id is not None:
            call = {"id": _item_id("fc"), "type": "function_call", "status": "in_progress", "call_id": delta.id}
            out += self._add({**call, "name": delta.name, "arguments": ""})
        assert self.open is not None and self.open["type"] == "function_call"
        if delta.arguments:
            self.open["arguments"] += delta.arguments
            out.append(self._event("response.function_call_arguments.delta", **self._where(), delta=delta.arguments))
        return out

    def close(self, status: str = "completed") -> list[bytes]:
        """The open item is done: its closing events."""
        item, out = self.open, []
        if item is None:
            return []
        where = self._where()
        item["status"] = status
        if item["type"] == "message":
            part = item["content"][0]
            out.append(
                self._event(
                    "response.output_text.done", **where, content_index=0, text=part["text"], logprobs=part["logprobs"]
                )
            )
            out.append(self._event("response.content_part.done", **where, content_index=0, part=part))
        else:
            done = {"arguments": item["arguments"], "name": item["name"]}
            out.append(self._event("response.function_call_arguments.done", **where, **done))
        self.open = None
        return [*out, self._event("response.output_item.done", output_index=where["output_index"], item=item)]

    def feed(self, piece: Piece) -> list[bytes]:
        out = self.text(piece) if piece.text or (piece.logprobs and not piece.calls) else []
        for delta in piece.calls:
            out += self.call(delta)
        return out

    def finish(self, choice: Choice) -> list[bytes]:
        """The last events: the open item closed (incomplete when max_output_tokens cut it), the final response."""
        cut = choice.finished is not None and choice.finished.finish_reason == "length"
        out = self.close("incomplete" if cut else "completed")
        self.status = "incomplete" if cut else "completed"
        kind = f"response.{self.status}"
        return [*out, self._event(kind, response=self.response())]

    def fail(self, error: GatewayError) -> list[bytes]:
        self.error, self.status = error, "failed"
        out = [self._event("error", code=error.code or error.type, message=error.message, param=error.param)]
        return [*out, self._event("response.failed", response=self.response())]

    def response(self) -> dict[str, Any]:
        body, chat, turn = self.body, self.chat, self.turn
        assert turn.ctx.route is not None
        done = self.status in ("completed", "incomplete")
        fmt = body.format.model_dump(by_alias=True, exclude_none=True)
        return {
            "id": turn.request_id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "background": False,
            "error": {"code": self.error.code or self.error.type, "message": self.error.message}
            if self.error
            else None,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": body.max_tool_calls,
            "model": turn.ctx.route.id,
            "output": self.items,
            "parallel_tool_calls": chat.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": body.store,
            "temperature": 1.0 if chat.temperature is None else chat.temperature,
            "text": {"format": fmt, "verbosity": "medium"},
            "tool_choice": _tool_choice(body),
            "tools": [t.model_dump(exclude_none=True) | {"strict": t.strict} for t in body.function_tools],
            "top_logprobs": body.top_logprobs or 0,
            "top_p": 1.0 if chat.top_p is None else chat.top_p,
            "truncation": "disabled",
            "usage": _usage(turn) if done else None,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    def answer_message(self) -> dict[str, Any]:
        """The output as the assistant's chat message: what a later `previous_response_id` continues from."""
        text = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "message")
        calls = [
            {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
            for i in self.items
            if i["type"] == "function_call"
        ]
        return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


def _tool_choice(body: ResponsesRequest) -> Any:
    choice = body.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


def _usage(turn: Turn) -> dict[str, Any]:
    usage = turn.usage
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


async def keep(writer: ResponseWriter, owner: str, history: list[dict[str, Any]]) -> None:
    """Store a finished response with its conversation, when the request asked for `store`."""
    if writer.body.store and writer.status in ("completed", "incomplete"):
        messages = [*history, *writer.body.input_messages(), writer.answer_message()]
        await sync_to_async(stored_responses.save)(owner, writer.response(), messages)


async def whole(writer: ResponseWriter, choice: Choice) -> dict[str, Any]:
    """Run the generation to its end and answer with the response object (errors raise)."""
    async for _, piece in choice_events(writer.turn, [choice]):
        if piece is not None:
            writer.feed(piece)
    writer.finish(choice)
    return writer.response()


async def event_stream(
    writer: ResponseWriter, choice: Choice, owner: str, history: list[dict[str, Any]]
) -> AsyncIterator[bytes]:
    """The streamed response; an error after the start is an `error` event and `response.failed`; the turn is
    settled in every case, and a client that leaves stops the model."""
    turn = writer.turn
    try:
        try:
            for out in writer.start():
                yield out
            async for _, piece in choice_events(turn, [choice]):
                for out in writer.feed(piece) if piece is not None else ():
                    yield out
            for out in writer.finish(choice):
                yield out
            await keep(writer, owner, history)
        except Exception as exc:
            for out in writer.fail(turn.fail(exc)):
                yield out
    except (asyncio.CancelledError, GeneratorExit) as exc:
        turn.fail(exc)
        raise
    finally:
        await turn.settle()
