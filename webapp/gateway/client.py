"""The web side's handle on a generation: pick a worker, send the request over the channel layer, read the replies.

Nothing here imports torch: the model lives in an inference worker, in this process
(in-memory layer) or another one (Redis). The worker is chosen from the heartbeats
(`webapp.worker.registry`); while waiting for replies the client keeps an eye on that
worker's heartbeat, so a worker that dies mid-stream is an error within seconds, not a hang.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings

from inference.params import SamplingParams
from webapp.gateway.errors import GatewayError
from webapp.gateway.routing import ModelRoute
from webapp.worker import registry
from webapp.worker.protocol import (
    DetokenizeRequest,
    GenerateRequest,
    InspectRequest,
    PromptAttentionRequest,
    ResampleRequest,
    TokenizeRequest,
    WorkerStatus,
    params_to_dict,
)


def new_request_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def _layer() -> BaseChannelLayer:
    layer = get_channel_layer()
    if layer is None:
        raise GatewayError(503, "No channel layer is configured.", "server_error", "no_channel_layer")
    return layer


def _layer_failed(exc: BaseException) -> GatewayError:
    return GatewayError(
        503,
        f"The channel layer failed ({type(exc).__name__}); retry shortly.",
        "server_error",
        "channel_layer_error",
        headers={"Retry-After": "2"},
    )


def _worker_lost(worker: str) -> GatewayError:
    return GatewayError(
        503,
        f"The inference worker {worker} stopped answering (no heartbeat for {registry.HEARTBEAT_TTL} s); retry.",
        "server_error",
        "worker_lost",
        headers={"Retry-After": "1"},
    )


async def _send(layer: BaseChannelLayer, channel: str, message: Mapping[str, Any]) -> None:
    try:
        await layer.send(channel, dict(message))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise _layer_failed(exc) from exc


def _raise_for(message: dict[str, Any]) -> None:
    if message.get("type") == "error":
        status = int(message.get("status", 500))
        headers = {"Retry-After": str(message["retry_after"])} if "retry_after" in message else {}
        kind = "invalid_request_error" if status < 500 else "server_error"
        raise GatewayError(
            status, str(message.get("message")), kind, message.get("code"), message.get("param"), headers
        )


class Replies:
    """The replies on one channel, read without ever cancelling a receive (cancel-safe on every layer), while
    watching the worker's heartbeat: a dead worker raises `worker_lost`, a silent live one `worker_timeout`."""

    def __init__(self, layer: BaseChannelLayer, channel: str, worker: str | None) -> None:
        self.layer = layer
        self.channel = channel
        self.worker = worker
        self._receiving: asyncio.Task[dict[str, Any]] | None = None

    async def next(self, patient: bool = False) -> dict[str, Any]:
        deadline = None if patient else time.monotonic() + settings.ROUNDTRIP_WORKER_TIMEOUT
        while True:
            if self._receiving is None:
                self._receiving = asyncio.ensure_future(self.layer.receive(self.channel))
            task = self._receiving
            done, _ = await asyncio.wait({task}, timeout=registry.HEARTBEAT_SECONDS)
            if done:
                self._receiving = None
                try:
                    message: dict[str, Any] = task.result()
                except Exception as exc:  # Redis down or the like: an answer in the API's own format, not a crash
                    raise _layer_failed(exc) from exc
                return message
            if self.worker is not None and not await sync_to_async(registry.is_alive, thread_sensitive=False)(
                self.worker
            ):
                raise _worker_lost(self.worker)
            if deadline is not None and time.monotonic() > deadline:
                raise GatewayError(
                    503,
                    "The inference worker did not answer in time; retry shortly.",
                    "server_error",
                    "worker_timeout",
                    headers={"Retry-After": "5"},
                )

    def close(self) -> None:
        if self._receiving is not None:
            self._receiving.cancel()
            self._receiving = None


async def _target(route: ModelRoute) -> tuple[str, str | None]:
    """Where to send work for `route`: the least-loaded live worker's inbox (counted in `registry.in_flight`
    until the caller's Generation closes), or, before any worker has reported, the model's shared channel.
    Whether there is room is the worker's call (heartbeats are up to a second old)."""
    workers = await sync_to_async(registry.live_workers, thread_sensitive=False)(route.id)
    worker: WorkerStatus | None = registry.pick(workers, route.id)
    if worker is None:
        return route.work_channel, None
    registry.in_flight[worker["worker"]] += 1
    return worker["channel"], worker["worker"]


class Generation:
    """One request's replies. `start()` waits until the worker accepted it (or raises its error)."""

    def __init__(
        self,
        layer: BaseChannelLayer,
        request_id: str,
        reply_to: str,
        worker: str | None,
        step: bool = False,
        n: int = 1,
    ) -> None:
        self.layer = layer
        self.step = step
        self.n = n  # choices: the generation ends when each has its "finished" event
        self.request_id = request_id
        self.replies = Replies(layer, reply_to, worker)
        self.control: str | None = None
        self.worker = worker
        self.ahead = 0  # requests waiting before this one, as the worker last said
        self.accepted: dict[str, Any] = {}
        self.finished: dict[str, Any] | None = None  # set once every choice finished (the first choice's event)
        self.finished_choices: dict[int, dict[str, Any]] = {}
        self.cancelled = False
        self.closed = False  # the worker's place in registry.in_flight (taken by _target) is given back on close

    async def start(self) -> dict[str, Any]:
        while True:
            message = await self.replies.next()
            _raise_for(message)
            if message.get("type") == "queued":
                self._queued(message)
            elif message.get("type") == "accepted":
                self.control = message.get("control", self.control)
                self.accepted = message
                return message

    def _queued(self, message: dict[str, Any]) -> None:
        self.control = message.get("control")
        self.ahead = int(message.get("ahead", 0))
        if self.worker is None:  # sent to the shared channel: now we know who took it
            self.worker = self.replies.worker = message.get("worker")
            if self.worker is not None:
                registry.in_flight[self.worker] += 1

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        """Every reply until the end: "waiting" updates and, one by one, trace events ({"type": "event", "event",
        "index": the choice}); an error reply raises GatewayError."""
        try:
            while self.finished is None:
                message = await self.replies.next(patient=self.step)
                _raise_for(message)
                kind = message.get("type")
                if kind == "cancelled":
                    self.cancelled = True
                    return
                if kind == "waiting":
                    self.ahead = int(message["ahead"])
                    yield message
                elif kind == "events":
                    index = int(message.get("index", 0))
                    for event in message["events"]:
                        if event["event"] == "finished":
                            self.finished_choices[index] = event
                            if len(self.finished_choices) == self.n:
                                self.finished = self.finished_choices.get(0, event)
                        yield {"type": "event", "event": event, "index": index}
        finally:
            self.close()

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The trace events until "finished" (or the worker confirms a cancel)."""
        async for message in self.messages():
            if message["type"] == "event":
                yield message["event"]

    async def next_token(self) -> None:
        """Step mode: let the worker produce the next token."""
        if self.control and self.finished is None:
            await _send(self.layer, self.control, {"type": "next", "request_id": self.request_id})

    async def cancel(self) -> None:
        """Tell the worker to stop (the client left or asked); harmless once it has finished."""
        if self.control and self.finished is None and not self.cancelled:
            try:
                await self.layer.send(self.control, {"type": "cancel", "request_id": self.request_id})
            except Exception:  # best effort: a worker that cannot be told drops the request when its replies bounce
                pass

    def close(self) -> None:
        """Stop reading and give back this request's place in the routing counts."""
        if not self.closed:
            self.closed = True
            self.replies.close()
            if self.worker is not None:
                registry.in_flight[self.worker] -= 1


async def generate(
    route: ModelRoute,
    messages: list[dict[str, Any]],
    params: SamplingParams,
    level: str = "off",
    request_id: str | None = None,
    truncate_history: bool = False,
    fit_max_tokens: bool = False,
    step: bool = False,
    prompt: str | None = None,
    n: int = 1,
    tools: list[dict[str, Any]] | None = None,
    continue_final: bool = False,
) -> Generation:
    """Send a generate request to the model's least-loaded worker and wait until it is accepted.
    `prompt`: raw text instead of `messages` (pass []), without the chat template; `n` choices;
    `tools`: function definitions shown to the model; `continue_final`: generation continues the last (assistant) message."""
    layer = _layer()
    reply_to = await layer.new_channel("reply.")
    channel, worker = await _target(route)
    generation = Generation(layer, request_id or new_request_id(), reply_to, worker, step, n)
    request: GenerateRequest = {
        "type": "generate",
        "model": route.id,
        "request_id": generation.request_id,
        "reply_to": reply_to,
        "messages": messages,
        "params": params_to_dict(params),
        "level": level,
        "truncate_history": truncate_history,
        "fit_max_tokens": fit_max_tokens,
        "step": step,
        "sent_at": time.time(),
    }
    if prompt is not None:
        request["prompt"] = prompt
    if n != 1:
        request["n"] = n
    if tools:
        request["tools"] = tools
    if continue_final:
        request["continue_final"] = True
    try:
        await _send(layer, channel, request)
        await generation.start()
    except BaseException:  # the client left, or the worker refused: make sure nothing keeps running
        await generation.cancel()
        generation.close()
        raise
    return generation


async def _ask(route: ModelRoute, message: dict[str, Any], answer: str) -> dict[str, Any]:
    """One request, one reply of type `answer` (tokenize, inspect)."""
    layer = _layer()
    reply_to = await layer.new_channel("reply.")
    channel, worker = await _target(route)
    replies = Replies(layer, reply_to, worker)
    try:
        await _send(
            layer, channel, {**message, "model": route.id, "request_id": new_request_id(), "reply_to": reply_to}
        )
        while True:
            reply = await replies.next()
            _raise_for(reply)
            if reply.get("type") == answer:
                return reply
    finally:
        replies.close()
        if worker is not None:
            registry.in_flight[worker] -= 1


async def tokenize(
    route: ModelRoute,
    text: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Ids and token strings for plain `text`, or for `messages` (and `tools`) rendered with the model's chat template."""
    message: TokenizeRequest = {"type": "tokenize", "model": route.id, "request_id": "", "reply_to": ""}
    if messages is not None:
        message["messages"] = messages
        if tools:
            message["tools"] = tools
    else:
        message["text"] = text or ""
    return await _ask(route, dict(message), "tokens")


async def detokenize(route: ModelRoute, ids: list[int]) -> str:
    message: DetokenizeRequest = {"type": "detokenize", "model": route.id, "request_id": "", "reply_to": "", "ids": ids}
    text: str = (await _ask(route, dict(message), "text"))["text"]
    return text


async def prompt_attention(route: ModelRoute, ids: list[int], layer: int) -> dict[str, Any]:
    """The prefill's token x token attention at `layer` for the prompt `ids` (its first 256 positions), by the worker."""
    message: PromptAttentionRequest = {
        "type": "prompt_attention",
        "model": route.id,
        "request_id": "",
        "reply_to": "",
        "ids": ids,
        "layer": layer,
    }
    attention: dict[str, Any] = (await _ask(route, dict(message), "prompt_attention"))["attention"]
    return attention


async def resample(
    route: ModelRoute, prompt_ids: list[int], generated: list[int], params: SamplingParams
) -> dict[str, Any]:
    """The sampled event of a past step drawn again with `params` (after `prompt_ids` + `generated`), by the worker."""
    message: ResampleRequest = {
        "type": "resample",
        "model": route.id,
        "request_id": "",
        "reply_to": "",
        "prompt_ids": prompt_ids,
        "generated": generated,
        "params": params_to_dict(params),
    }
    event: dict[str, Any] = (await _ask(route, dict(message), "resampled"))["event"]
    return event


async def inspect(route: ModelRoute, ids: list[int]) -> dict[str, Any]:
    """Full-level detail (attention, norms, logit lens) for the last of `ids`, recomputed by the worker."""
    message: InspectRequest = {
        "type": "inspect",
        "model": route.id,
        "request_id": "",
        "reply_to": "",
        "ids": ids,
        "sent_at": time.time(),
    }
    detail: dict[str, Any] = (await _ask(route, dict(message), "inspection"))["detail"]
    return detail
