"""One chat turn from the page: through the same gateway as the API, then the trace, as WebSocket frames.

Frames, in order: "request" (the JSON as the server received it), "gateway" (each check
with its time, the rate-limit bucket before and after, the model), "accepted" (with the worker that took it),
"waiting" while the batch is full (how many requests are ahead), one "trace" per event, "sse" (the bytes an API
client would have received for the same answer: `api_replay`), "usage" (the
usage-log row), "done" (with where the turn was kept: the conversation, the question's id and the stored answer); or
an "error" frame instead. A turn that finished or was stopped is kept (a stopped one with the text it had).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from visualizer.api_replay import SseReplay
from visualizer.conversations import Outcome, Owner, Placement, file_turn
from visualizer.frames import ChatFrame
from webapp.api.protocol import ChatCompletionRequest, parse
from webapp.gateway import client
from webapp.gateway.errors import GatewayError
from webapp.gateway.identity import identify_session
from webapp.gateway.lifecycle import Turn
from webapp.gateway.upstream.generation import UpstreamGeneration
from webapp.usage.models import UsageRecord
from webapp.worker import wire


def error_frame(error: GatewayError) -> dict[str, Any]:
    """A gateway error as the socket sends it: the status and OpenAI's error fields."""
    return {"type": "error", "status": error.status, "code": error.code, "message": error.message, "param": error.param}


def accepted_frame(generation: client.Generation | UpstreamGeneration) -> dict[str, Any]:
    """The worker took the turn: which worker, the weights it holds, the prompt's length, the seed, the wait; for an
    upstream model, which server answered and which were tried before it (the forward pass is out of sight)."""
    accepted = generation.accepted
    if accepted is None:
        return {"type": "accepted"}
    frame = {
        "type": "accepted",
        "request_id": accepted.request_id,
        "worker": accepted.worker,
        "weights": accepted.weights,
        "prompt_tokens": accepted.prompt_tokens,
        "seed": accepted.seed,
        "queued": accepted.queued,
    }
    if isinstance(generation, UpstreamGeneration):
        frame["upstream"] = generation.routing()
    return frame


@dataclass(frozen=True)
class Visitor:
    user_id: int | None
    session_key: str
    client_ip: str | None


class Run:
    def __init__(self, visitor: Visitor, payload: dict[str, Any]) -> None:
        self.visitor = visitor
        self.payload = payload
        self.generation: client.Generation | UpstreamGeneration | None = None
        self.stop_asked = False  # Stop pressed before the worker took the turn: it stops as soon as it does

    async def next_token(self) -> None:
        if self.generation is not None:
            await self.generation.next_token()

    async def cancel(self) -> None:
        self.stop_asked = True
        if self.generation is not None:
            await self.generation.cancel()

    def _body(self) -> tuple[dict[str, Any], ChatFrame]:
        """The frame, checked field by field, and as an OpenAI-style body for the chat request's parser."""
        frame: ChatFrame = parse(ChatFrame, self.payload)
        # text to complete travels as the one message the chat request's checks see; it is generated without the
        # template (`frames`)
        messages = frame.messages if frame.prompt is None else [{"role": "user", "content": frame.prompt}]
        body: dict[str, Any] = {"model": frame.model, "messages": messages}
        for name, value in frame.params.items():
            body[name] = value
        if frame.continue_final_message is not None:  # a branch: the answer so far, then the model goes on from it
            body["continue_final_message"] = frame.continue_final_message
        return body, frame

    async def frames(self) -> AsyncIterator[dict[str, Any]]:
        turn = Turn("ws.chat", self.visitor.client_ip, stream=True)
        ctx = turn.ctx
        ctx.request_body = self.payload
        yield {"type": "request", "request_id": turn.request_id, "body": self.payload, "t": time.time()}
        request: ChatCompletionRequest | None = None
        frame: ChatFrame | None = None
        answered = ""  # the text so far, kept if the turn is stopped
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
            raw: dict[str, Any] = {"prompt": frame.prompt} if frame.prompt is not None else {}
            self.generation = await turn.generate(
                [] if raw else request.chat_messages,
                request.params,
                frame.level,
                passthrough=request.upstream_fields,
                fit_max_tokens=not request.max_tokens_given,
                step=frame.step,
                continue_final=request.continue_final_message,
                **raw,
            )
            yield accepted_frame(self.generation)
            replay = SseReplay(turn)
            if self.stop_asked:
                await self.generation.cancel()
            async for message in turn.messages():
                if isinstance(message, wire.Waiting):
                    yield {"type": "waiting", "ahead": message.ahead}
                else:
                    if message.index == 0 and isinstance(message.event, wire.TextDelta):
                        answered += message.event.text
                    replay.feed(message.event)
                    yield {"type": "trace", "event": message.event}
            yield {"type": "sse", "body": replay.body()}
        except asyncio.CancelledError as exc:  # the socket closed: nothing may keep running (or stay paused)
            turn.fail(exc)
            record = await turn.settle()
            if request is not None and frame is not None and self.generation is not None:
                # what was written is kept, as if stopped: the page finds it when it reconnects
                await asyncio.shield(sync_to_async(self._keep)(turn, request, frame, record, answered))
            raise
        except Exception as exc:  # refused, failed, or something unexpected: the page always hears why
            error = turn.fail(exc)
            yield error_frame(error)
        record = await turn.settle()
        kept: dict[str, Any] = {"conversation": self.payload.get("conversation")}
        if request is not None and frame is not None and self.generation is not None and turn.status in (200, 499):
            kept = await sync_to_async(self._keep)(turn, request, frame, record, answered)
        yield {"type": "usage", **turn.usage_report()}
        yield {"type": "done", "request_id": turn.request_id, **kept}

    def _keep(
        self, turn: Turn, request: ChatCompletionRequest, frame: ChatFrame, record: UsageRecord, answered: str
    ) -> dict[str, Any]:
        """File the turn in this visitor's conversation: finished, or stopped with the text it had (possibly none)."""
        finished = turn.usage.finished.get(0)
        messages = request.chat_messages
        answer = finished.text if finished is not None else answered
        if request.continue_final_message:  # the exchange's answer as it now reads, with the part it went on from
            answer = messages[-1]["content"] + answer
            messages = messages[:-1]
        reason: str = finished.finish_reason if finished is not None else "stopped"
        speed = finished.timings.decode_tokens_per_s if finished is not None else None
        outcome = Outcome(
            request_id=turn.request_id,
            answer=answer,
            finish_reason=reason,
            completion_tokens=record.completion_tokens,
            ttft_ms=record.ttft_ms,
            tokens_per_s=speed,
        )
        placement = Placement(frame.conversation, frame.parent, frame.answer_to, frame.extend)
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        owner = Owner(self.visitor.user_id, self.visitor.session_key)
        kept = file_turn(owner, placement, messages[-1]["content"], system, outcome)
        self.payload["conversation"] = kept["conversation"]
        return kept
