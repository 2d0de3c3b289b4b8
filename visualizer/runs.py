"""One chat turn from the page: through the same gateway as the API, then the trace, as WebSocket frames.

Frames, in order: "request" (the JSON as the server received it), "gateway" (each check
with its time, the rate-limit bucket before and after, the model), "accepted" (with the worker that took it),
"waiting" while the batch is full (how many requests are ahead), one "trace" per event, "usage" (the
usage-log row), "done"; or an "error" frame instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from visualizer.frames import ChatFrame
from visualizer.models import Conversation
from webapp.api.protocol import ChatCompletionRequest, parse
from webapp.gateway import client
from webapp.gateway.errors import GatewayError
from webapp.gateway.identity import identify_session
from webapp.gateway.lifecycle import Turn
from webapp.worker import wire


def error_frame(error: GatewayError) -> dict[str, Any]:
    """A gateway error as the socket sends it: the status and OpenAI's error fields."""
    return {"type": "error", "status": error.status, "code": error.code, "message": error.message, "param": error.param}


def accepted_frame(accepted: wire.Accepted | None) -> dict[str, Any]:
    """The worker took the turn: which worker, the weights it holds, the prompt's length, the seed, the wait."""
    if accepted is None:
        return {"type": "accepted"}
    return {
        "type": "accepted",
        "request_id": accepted.request_id,
        "worker": accepted.worker,
        "weights": accepted.weights,
        "prompt_tokens": accepted.prompt_tokens,
        "seed": accepted.seed,
        "queued": accepted.queued,
    }


@dataclass(frozen=True)
class Visitor:
    user_id: int | None
    session_key: str
    client_ip: str | None


class Run:
    def __init__(self, visitor: Visitor, payload: dict[str, Any]) -> None:
        self.visitor = visitor
        self.payload = payload
        self.generation: client.Generation | None = None

    async def next_token(self) -> None:
        if self.generation is not None:
            await self.generation.next_token()

    async def cancel(self) -> None:
        if self.generation is not None:
            await self.generation.cancel()

    def _body(self) -> tuple[dict[str, Any], ChatFrame]:
        """The frame, checked field by field, and as an OpenAI-style body for the chat request's parser."""
        frame: ChatFrame = parse(ChatFrame, self.payload)
        body: dict[str, Any] = {"model": frame.model, "messages": frame.messages}
        for name, value in frame.params.items():
            body[name] = value
        if frame.continue_final_message is not None:  # a branch: the answer so far, then the model goes on from it
            body["continue_final_message"] = frame.continue_final_message
        return body, frame

    async def frames(self) -> AsyncIterator[dict[str, Any]]:
        turn = Turn("ws.chat", self.visitor.client_ip, stream=True)
        ctx = turn.ctx
        yield {"type": "request", "request_id": turn.request_id, "body": self.payload, "t": time.time()}
        request: ChatCompletionRequest | None = None
        try:
            turn.authenticated(
                identify_session(self.visitor.user_id, self.visitor.session_key, self.visitor.client_ip),
                time.perf_counter(),
            )
            body, frame = self._body()
            request = parse(ChatCompletionRequest, body)
            ctx.prompt_text = request.chat_messages[-1]["content"]
            await turn.admit(request.model)
            yield {"type": "gateway", **turn.gateway_report()}
            self.generation = await turn.generate(
                request.chat_messages,
                request.params,
                frame.level,
                fit_max_tokens=not request.max_tokens_given,
                step=frame.step,
                continue_final=request.continue_final_message,
            )
            yield accepted_frame(self.generation.accepted)
            async for message in turn.messages():
                if isinstance(message, wire.Waiting):
                    yield {"type": "waiting", "ahead": message.ahead}
                else:
                    yield {"type": "trace", "event": message.event}
        except asyncio.CancelledError as exc:  # the socket closed: nothing may keep running (or stay paused)
            turn.fail(exc)
            await turn.settle()
            raise
        except Exception as exc:  # refused, failed, or something unexpected: the page always hears why
            error = turn.fail(exc)
            yield error_frame(error)
        await turn.settle()
        finished = turn.usage.finished.get(0)
        if finished is not None and request is not None:
            messages, answer = request.chat_messages, finished.text
            if request.continue_final_message:
                # a branch: the exchange is the question and the whole answer, as it now reads
                messages, answer = messages[:-1], messages[-1]["content"] + answer
            await sync_to_async(self._save_exchange)(turn.request_id, messages, answer)
        yield {"type": "usage", **turn.usage_report()}
        yield {"type": "done", "request_id": turn.request_id, "conversation": self.payload.get("conversation")}

    def _save_exchange(self, request_id: str, messages: list[dict[str, str]], answer: str) -> None:
        """Keep the turn: in the conversation the page named (if it is this visitor's), else in a new one."""
        conversation_id = self.payload.get("conversation")  # checked to be a positive integer by `_body`
        question = messages[-1]["content"]
        owned = Conversation.owned_by(self.visitor.user_id, self.visitor.session_key)
        conversation = owned.filter(pk=conversation_id).first() if conversation_id is not None else None
        if conversation is None:
            system = next((m["content"] for m in messages if m["role"] == "system"), "")
            conversation = Conversation.objects.create(
                user_id=self.visitor.user_id,
                session_key=self.visitor.session_key,
                title=question[:80] or "(empty)",
                system_prompt=system,
            )
            self.payload["conversation"] = conversation.pk
        conversation.add_exchange(question, answer, request_id)
