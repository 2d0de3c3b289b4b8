"""One chat turn from the page: through the same gateway as the API, then the trace, as WebSocket frames.

Frames, in order: "request" (the JSON as the server received it), "gateway" (each check
with its time, the rate-limit bucket before and after, the model), "accepted" (with the worker that took it),
"waiting" while the batch is full (how many requests are ahead), one "trace" per event, "usage" (the
usage-log row), "done"; or an "error" frame instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from asgiref.sync import sync_to_async

from webapp.api.completions import Assembler
from webapp.api.protocol import ChatCompletionRequest, parse
from webapp.gateway import client
from webapp.gateway.errors import GatewayError, bad_request
from webapp.gateway.gateway import RequestContext, limit_and_route, record_usage
from webapp.gateway.identity import identify_session
from visualizer.models import Conversation

LEVELS = ("summary", "full")
RUN_FIELDS = {"type", "model", "messages", "params", "level", "step", "conversation"}
PARAM_FIELDS = {"temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop",
                "logit_bias"}


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

    def _body(self) -> tuple[dict[str, Any], str, bool]:
        """The payload as an OpenAI-style body for the shared parser, plus the trace level and step mode."""
        p = self.payload
        unknown = sorted(set(p) - RUN_FIELDS)
        if unknown:
            raise bad_request(f"Unknown field in the chat message: {unknown[0]}", unknown[0])
        params = p.get("params") or {}
        if not isinstance(params, dict) or set(params) - PARAM_FIELDS:
            raise bad_request(f"'params' may only hold {', '.join(sorted(PARAM_FIELDS))}.", "params")
        level = p.get("level", "summary")
        if level not in LEVELS:
            raise bad_request(f"'level' must be one of {', '.join(LEVELS)}.", "level")
        return {"model": p.get("model", "default"), "messages": p.get("messages"), **params}, level, bool(p.get("step"))

    async def frames(self) -> AsyncIterator[dict[str, Any]]:
        ctx = RequestContext(client.new_request_id(), "ws.chat", self.visitor.client_ip, stream=True)
        yield {"type": "request", "request_id": ctx.request_id, "body": self.payload, "t": time.time()}
        assembler = Assembler(False)
        status, code = 200, ""
        try:
            started = time.perf_counter()
            identity = identify_session(self.visitor.user_id, self.visitor.session_key)
            ctx.identity = identity
            ctx.timed("authenticate", started, who=identity.label)
            body, level, step = self._body()
            request: ChatCompletionRequest = parse(ChatCompletionRequest, body)
            ctx.prompt_text = request.chat_messages[-1]["content"]
            await sync_to_async(limit_and_route)(ctx, identity, request.model)
            assert ctx.route is not None and ctx.rate is not None
            yield {
                "type": "gateway",
                "identity": identity.label,
                "model": ctx.route.id,
                "channel": ctx.route.work_channel,
                "limits": dataclasses.asdict(identity.limits),
                "rate": ctx.rate.counted,
                "stages": [{"name": s.name, "ms": s.seconds * 1000, "detail": s.detail} for s in ctx.stages],
            }
            self.generation = await client.generate(
                ctx.route, request.chat_messages, request.params, level, ctx.request_id, fit_max_tokens=not request.max_tokens_given, step=step
            )
            assembler.prompt_tokens = self.generation.accepted.get("prompt_tokens", 0)
            yield {"type": "accepted", **{k: v for k, v in self.generation.accepted.items() if k not in ("type", "control")}}
            ctx.worker = self.generation.worker or ""
            async for message in self.generation.messages():
                if message["type"] == "waiting":
                    yield {"type": "waiting", "ahead": message["ahead"]}
                    continue
                assembler.feed(message["event"])
                yield {"type": "trace", "event": message["event"]}
            if self.generation.cancelled:
                status, code = 499, "cancelled"
        except GatewayError as exc:
            status, code = exc.status, exc.code or exc.type
            await asyncio.shield(self.cancel())  # nothing may keep running (or stay paused) for a turn that ended
            yield {"type": "error", "status": exc.status, "code": exc.code, "message": exc.message, "param": exc.param}
        except asyncio.CancelledError:
            status, code = 499, "client_closed_request"
            await asyncio.shield(self.cancel())
            raise
        finally:
            if self.generation is not None:
                self.generation.close()
            usage = assembler.usage()
            ttft = None if assembler.first_token_at is None else assembler.first_token_at - ctx.started
            finish = assembler.finish_reason if status == 200 else ("cancelled" if status == 499 else "error")
            record = await asyncio.shield(
                sync_to_async(record_usage)(ctx, status, finish, code, usage["prompt_tokens"], usage["completion_tokens"], ttft,
                                            usage["prompt_tokens_details"]["cached_tokens"])
            )
        if assembler.finished is not None:
            await sync_to_async(self._save_exchange)(ctx.request_id, request.chat_messages, "".join(assembler.text))
        yield {
            "type": "usage",
            "record": {"id": record.pk, "request_id": record.request_id, "status": record.status, "finish_reason": record.finish_reason,
                       "prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens,
                       "ttft_ms": record.ttft_ms, "total_ms": record.total_ms, "model": record.model},
            "stages": [{"name": s.name, "ms": s.seconds * 1000} for s in ctx.stages],
        }
        yield {"type": "done", "request_id": ctx.request_id, "conversation": self.payload.get("conversation")}

    def _save_exchange(self, request_id: str, messages: list[dict[str, str]], answer: str) -> None:
        """Keep the turn: in the conversation the page named (if it is this visitor's), else in a new one."""
        conversation_id = self.payload.get("conversation")
        question = messages[-1]["content"]
        owned = Conversation.owned_by(self.visitor.user_id, self.visitor.session_key)
        conversation = owned.filter(pk=conversation_id).first() if isinstance(conversation_id, int) else None
        if conversation is None:
            system = next((m["content"] for m in messages if m["role"] == "system"), "")
            conversation = Conversation.objects.create(
                user_id=self.visitor.user_id, session_key=self.visitor.session_key, title=question[:80] or "(empty)", system_prompt=system
            )
            self.payload["conversation"] = conversation.pk
        conversation.add_exchange(question, answer, request_id)


async def inspect(visitor: Visitor, frame: dict[str, Any]) -> dict[str, Any]:
    """The page asks for more: full-level detail of one token after the fact, through the same gateway."""
    ctx = RequestContext(client.new_request_id(), "ws.inspect", visitor.client_ip)
    status, code = 200, ""
    try:
        identity = identify_session(visitor.user_id, visitor.session_key)
        await sync_to_async(limit_and_route)(ctx, identity, str(frame.get("model", "default")))
        assert ctx.route is not None
        ids = frame.get("ids")
        if not isinstance(ids, list):
            raise bad_request("'ids' must be a list of token ids.", "ids")
        detail = await client.inspect(ctx.route, ids)  # the worker checks each id against its vocabulary
        return {"type": "inspection", "step": frame.get("step"), "detail": detail}
    except GatewayError as exc:
        status, code = exc.status, exc.code or exc.type
        return {"type": "error", "status": exc.status, "code": exc.code, "message": exc.message, "param": exc.param}
    finally:
        await asyncio.shield(sync_to_async(record_usage)(ctx, status, "" if status == 200 else "error", code, len(frame.get("ids") or [])))
