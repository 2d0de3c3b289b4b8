"""The web side's handle on a generation: send the request over the channel layer, read the replies.

Nothing here imports torch: the model lives in an inference worker, in this process
(in-memory layer) or another one (Redis).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator

from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings

from inference.sampling import SamplingParams
from webapp.gateway.errors import GatewayError
from webapp.gateway.routing import ModelRoute
from webapp.worker.protocol import params_to_dict


def new_request_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def _layer() -> BaseChannelLayer:
    layer = get_channel_layer()
    if layer is None:
        raise GatewayError(503, "No channel layer is configured.", "server_error", "no_channel_layer")
    return layer


async def _receive(layer: BaseChannelLayer, channel: str, patient: bool = False) -> dict[str, Any]:
    """The next reply; a silent worker is a 503 after ROUNDTRIP_WORKER_TIMEOUT unless `patient` (step mode waits for a person)."""
    try:
        timeout = None if patient else settings.ROUNDTRIP_WORKER_TIMEOUT
        message: dict[str, Any] = await asyncio.wait_for(layer.receive(channel), timeout)
    except asyncio.TimeoutError:
        raise GatewayError(
            503, "The inference worker did not answer in time; retry shortly.", "server_error", "worker_timeout", headers={"Retry-After": "5"}
        ) from None
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # Redis down or the like: an answer in the API's own format, not a crash
        raise _layer_failed(exc) from exc
    return message


def _layer_failed(exc: Exception) -> GatewayError:
    return GatewayError(503, f"The channel layer failed ({type(exc).__name__}); retry shortly.", "server_error", "channel_layer_error", headers={"Retry-After": "2"})


async def _send(layer: BaseChannelLayer, channel: str, message: dict[str, Any]) -> None:
    try:
        await layer.send(channel, message)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise _layer_failed(exc) from exc


def _raise_for(message: dict[str, Any]) -> None:
    if message.get("type") == "error":
        status = int(message.get("status", 500))
        headers = {"Retry-After": str(message["retry_after"])} if "retry_after" in message else {}
        kind = "invalid_request_error" if status < 500 else "server_error"
        raise GatewayError(status, str(message.get("message")), kind, message.get("code"), message.get("param"), headers)


class Generation:
    """One request's replies. `start()` waits until the worker accepted it (or raises its error)."""

    def __init__(self, layer: BaseChannelLayer, request_id: str, reply_to: str, step: bool = False) -> None:
        self.layer = layer
        self.step = step
        self.request_id = request_id
        self.reply_to = reply_to
        self.control: str | None = None
        self.accepted: dict[str, Any] = {}
        self.finished: dict[str, Any] | None = None
        self.cancelled = False

    async def start(self) -> dict[str, Any]:
        while True:
            message = await _receive(self.layer, self.reply_to)
            _raise_for(message)
            if message.get("type") == "queued":
                self.control = message.get("control")
            elif message.get("type") == "accepted":
                self.control = message.get("control", self.control)
                self.accepted = message
                return message

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """Trace events until "finished" (or the worker confirms a cancel); an error reply mid-stream raises GatewayError."""
        while self.finished is None:
            message = await _receive(self.layer, self.reply_to, patient=self.step)
            _raise_for(message)
            if message.get("type") == "cancelled":
                self.cancelled = True
                return
            if message.get("type") != "event":
                continue
            event: dict[str, Any] = message["event"]
            if event["event"] == "finished":
                self.finished = event
            yield event

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


async def generate(
    route: ModelRoute,
    messages: list[dict[str, str]],
    params: SamplingParams,
    level: str = "off",
    request_id: str | None = None,
    truncate_history: bool = False,
    fit_max_tokens: bool = False,
    step: bool = False,
) -> Generation:
    """Send a generate request to the model's workers and wait until it is accepted."""
    layer = _layer()
    reply_to = await layer.new_channel("reply.")
    generation = Generation(layer, request_id or new_request_id(), reply_to, step)
    await _send(
        layer,
        route.work_channel,
        {
            "type": "generate",
            "request_id": generation.request_id,
            "reply_to": reply_to,
            "messages": messages,
            "params": params_to_dict(params),
            "level": level,
            "truncate_history": truncate_history,
            "fit_max_tokens": fit_max_tokens,
            "step": step,
            "sent_at": time.time(),
        },
    )
    try:
        await generation.start()
    except BaseException:  # the client left, or the worker refused: make sure nothing keeps running
        await generation.cancel()
        raise
    return generation


async def tokenize(route: ModelRoute, text: str) -> dict[str, Any]:
    layer = _layer()
    reply_to = await layer.new_channel("reply.")
    await _send(layer, route.work_channel, {"type": "tokenize", "request_id": new_request_id(), "reply_to": reply_to, "text": text})
    message = await _receive(layer, reply_to)
    _raise_for(message)
    return message


async def inspect(route: ModelRoute, ids: list[int]) -> dict[str, Any]:
    """Full-level detail (attention, norms, logit lens) for the last of `ids`, recomputed by the worker."""
    layer = _layer()
    reply_to = await layer.new_channel("reply.")
    await _send(layer, route.work_channel, {"type": "inspect", "request_id": new_request_id(), "reply_to": reply_to, "ids": ids, "sent_at": time.time()})
    while True:
        message = await _receive(layer, reply_to)
        _raise_for(message)
        if message.get("type") == "inspection":
            detail: dict[str, Any] = message["detail"]
            return detail
