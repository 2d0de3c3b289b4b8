"""The inference worker's event-loop side: load the models, consume their work channels, send replies.

The same `serve` runs inside Daphne (in-memory layer, the default) or as its own process
(`manage.py runinferenceworker`, with Redis). Replies from the engine threads pass
through one outbox task, so each request's messages reach the channel layer in order.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable

from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings
from django.core.cache import cache

from inference.loader import LoadedModel, load_model
from inference.progress import LoadProgress, ProgressCallback, terminal_progress
from webapp.gateway.routing import ModelRoute, configured_models
from webapp.worker.runner import EngineRunner

log = logging.getLogger("roundtrip.worker")
STATUS_KEY = "rt:model-status:{}"


def model_status(model_id: str) -> dict[str, Any]:
    """The latest load progress a worker published for `model_id` (for health checks and the page)."""
    status: dict[str, Any] = cache.get(STATUS_KEY.format(model_id)) or {"state": "not started"}
    return status


def _publisher(model_id: str, terminal: ProgressCallback | None) -> ProgressCallback:
    def publish(p: LoadProgress) -> None:
        state = "ready" if p.stage == "building" and p.fraction == 1.0 else "loading"
        cache.set(STATUS_KEY.format(model_id), {"state": state, "stage": p.stage, "done": p.done, "total": p.total, "detail": p.detail}, None)
        if terminal is not None:
            terminal(p)

    return publish


class Outbox:
    """Hands replies from engine threads to the event loop and sends them in order."""

    def __init__(self, layer: BaseChannelLayer, loop: asyncio.AbstractEventLoop) -> None:
        self._layer = layer
        self._loop = loop
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.runner: EngineRunner | None = None

    def emit(self, channel: str, message: dict[str, Any]) -> None:
        """Thread-safe: called from engine threads."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (channel, message))

    async def run(self) -> None:
        while True:
            channel, message = await self._queue.get()
            try:
                await self._layer.send(channel, message)
            except ChannelFull:  # nobody is reading: the client is gone
                if self.runner is not None:
                    self.runner.cancel(message.get("request_id", ""))
            except Exception:  # the layer failed: this request cannot be answered, the others may still be
                log.exception("sending to %s failed; dropping that request", channel)
                if self.runner is not None:
                    self.runner.cancel(message.get("request_id", ""))


async def serve(routes: list[ModelRoute] | None = None, show_progress: bool = True) -> None:
    """Load the models (on the engine thread), then answer their work channels until cancelled."""
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is not configured"
    loop = asyncio.get_running_loop()
    routes = routes or configured_models()
    outbox = Outbox(layer, loop)
    control = await layer.new_channel("inference-control.")
    ready = {route.id: asyncio.Event() for route in routes}

    def loader(route: ModelRoute) -> Callable[[], LoadedModel]:
        progress = _publisher(route.id, terminal_progress() if show_progress else None)

        def load() -> LoadedModel:
            try:
                loaded = load_model(route.path or None, progress=progress)
            except Exception as exc:
                cache.set(STATUS_KEY.format(route.id), {"state": "failed", "detail": str(exc)}, None)
                raise
            log.info("model %s ready: %s on %s in %.2fs", route.id, loaded.path, loaded.device, loaded.load_seconds)
            return loaded

        return load

    def on_ready(model_id: str) -> None:
        loop.call_soon_threadsafe(ready[model_id].set)

    runner = EngineRunner(
        {route.id: loader(route) for route in routes},
        on_ready,
        outbox.emit,
        control,
        settings.ROUNDTRIP_MAX_ACTIVE_STREAMS,
        settings.ROUNDTRIP_MAX_QUEUED,
    )
    outbox.runner = runner
    tasks = [asyncio.create_task(outbox.run()), asyncio.create_task(_consume_control(layer, control, runner))]
    tasks += [asyncio.create_task(_consume_work(layer, route, runner, ready[route.id])) for route in routes]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await loop.run_in_executor(None, runner.stop)


async def _messages(layer: BaseChannelLayer, channel: str) -> AsyncIterator[dict[str, Any]]:
    """Messages on `channel`, forever: a channel-layer hiccup (Redis restarting, a timeout) is logged and retried."""
    while True:
        try:
            message: dict[str, Any] = await layer.receive(channel)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("receiving on %s failed; retrying", channel)
            await asyncio.sleep(1.0)
            continue
        yield message


async def _consume_work(layer: BaseChannelLayer, route: ModelRoute, runner: EngineRunner, ready: asyncio.Event) -> None:
    """Requests wait in the channel until the model is loaded, then go to the engine thread."""
    await ready.wait()
    async for message in _messages(layer, route.work_channel):
        try:
            if route.id in runner.failures:
                reason = f"The model {route.id!r} could not be loaded: {runner.failures[route.id]}"
                await layer.send(message["reply_to"], {"type": "error", "request_id": message.get("request_id"), "status": 503,
                                                       "code": "model_unavailable", "message": reason, "param": None})
            elif message.get("type") in ("generate", "inspect"):
                runner.submit(route.id, message)
            elif message.get("type") == "tokenize":
                runner.tokenize(route.id, message)
            else:
                log.warning("ignoring message of type %r on %s", message.get("type"), route.work_channel)
        except Exception:  # a malformed message must not stop the worker
            log.exception("bad message on %s", route.work_channel)


async def _consume_control(layer: BaseChannelLayer, channel: str, runner: EngineRunner) -> None:
    async for message in _messages(layer, channel):
        if message.get("type") == "cancel":
            runner.cancel(str(message.get("request_id", "")))
        elif message.get("type") == "next":
            runner.next_token(str(message.get("request_id", "")))
