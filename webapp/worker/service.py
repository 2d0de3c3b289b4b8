"""The inference worker's event-loop side: load the models, consume work, send replies, beat.

The same `serve` runs inside the web server (in-memory layer, the default) or as its own process
(`manage.py runinferenceworker`, with Redis), as many of them as there are machines or
GPUs. Each worker consumes its own inbox (the channel its heartbeat names, where the
gateway sends it work) and the shared work channel of every model it holds; it beats
every second so the web side can route to it and notices within seconds when it dies.
Every message is parsed into its wire class first (`webapp.worker.wire`); one that does
not parse is answered with an error where it says where to, and logged, never fatal.
Replies from the engine thread pass through one outbox (`webapp.worker.outbox`), so each
request's messages reach the channel layer in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from asgiref.sync import sync_to_async
from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings

from inference.loader import LoadedModel, load_model
from inference.progress import LoadProgress, terminal_progress
from inference.scheduler import SchedulerConfig
from webapp.catalog import ModelRoute, local_models
from webapp.worker import registry, wire
from webapp.worker.outbox import Outbox
from webapp.worker.runner import EngineRunner

log = logging.getLogger("roundtrip.worker")


def scheduler_config() -> SchedulerConfig:
    """The engine's limits, from settings."""
    return SchedulerConfig(
        max_batch=settings.ROUNDTRIP_MAX_BATCH,
        max_waiting=settings.ROUNDTRIP_MAX_QUEUED,
        kv_budget_bytes=settings.ROUNDTRIP_KV_CACHE_BYTES,
        prefill_chunk=settings.ROUNDTRIP_PREFILL_CHUNK,
        prefill_chunk_decoding=settings.ROUNDTRIP_PREFILL_CHUNK_DECODING,
        decode_gap_stretch=settings.ROUNDTRIP_DECODE_GAP_STRETCH,
        prefix_cache_bytes=settings.ROUNDTRIP_PREFIX_CACHE_BYTES,
    )


def loader(route: ModelRoute, show_progress: bool) -> Callable[[], LoadedModel]:
    """A function that loads `route`'s model as `ROUNDTRIP_LOAD` says, publishing its progress for `/health`."""
    terminal = terminal_progress() if show_progress else None

    def progress(p: LoadProgress) -> None:
        state: Literal["ready", "loading"] = "ready" if p.stage == "building" and p.fraction == 1.0 else "loading"
        registry.publish_load(
            route.id, wire.ModelLoad(state=state, stage=p.stage, done=p.done, total=p.total, detail=p.detail)
        )
        if terminal is not None:
            terminal(p)

    def load() -> LoadedModel:
        try:
            loaded = load_model(route.path or None, settings.ROUNDTRIP_LOAD, progress)
        except Exception as exc:
            registry.publish_load(route.id, wire.ModelLoad(state="failed", detail=str(exc)))
            raise
        log.info(
            "model %s ready: %s on %s (%s) in %.2fs",
            route.id,
            loaded.path,
            loaded.device,
            loaded.weights_description,
            loaded.load_seconds,
        )
        registry.publish_load(
            route.id,
            wire.ModelLoad(
                state="ready",
                stage="building",
                done=2,
                total=2,
                detail="ready",
                weights=loaded.weights_description,
                device=str(loaded.device),
                card=wire.ModelCard(**dataclasses.asdict(loaded.card)),
            ),
        )
        return loaded

    return load


async def serve(routes: list[ModelRoute] | None = None, show_progress: bool = True) -> None:
    """Load the models (on the engine thread), then answer work until cancelled, beating all along."""
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is not configured"
    loop = asyncio.get_running_loop()
    routes = routes or list(local_models())
    outbox = Outbox(layer, loop)
    inbox = await layer.new_channel("inference-worker.")
    worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    ready = {route.id: asyncio.Event() for route in routes}
    for route in routes:  # at once: requests for these models wait for this worker instead of being refused
        await sync_to_async(registry.publish_load)(route.id, wire.ModelLoad(state="loading", stage="starting"))

    beat_now = asyncio.Event()

    def on_ready(model_id: str) -> None:
        loop.call_soon_threadsafe(ready[model_id].set)
        loop.call_soon_threadsafe(beat_now.set)  # the web side may route to this model from now, not a second later

    loaders = {route.id: loader(route, show_progress) for route in routes}
    runner = EngineRunner(
        loaders, on_ready, outbox.emit, inbox, scheduler_config(), worker_id, outbox.settle, outbox.hold
    )
    outbox.on_undeliverable = runner.cancel
    tasks = [
        asyncio.create_task(outbox.run()),
        asyncio.create_task(_heartbeat(worker_id, inbox, runner, beat_now)),
        asyncio.create_task(_consume(layer, inbox, None, runner, ready)),
    ]
    tasks += [asyncio.create_task(_consume(layer, route.work_channel, route.id, runner, ready)) for route in routes]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await sync_to_async(registry.leave)(worker_id)
        await loop.run_in_executor(None, runner.stop)


async def _heartbeat(worker_id: str, inbox: str, runner: EngineRunner, beat_now: asyncio.Event) -> None:
    """Tell the web side, every second, that this worker is alive and what it holds (from its first second), and at
    once when `beat_now` is set (a model became ready)."""
    while True:
        status = wire.WorkerStatus(
            worker=worker_id,
            channel=inbox,
            host=socket.gethostname(),
            pid=os.getpid(),
            t=time.time(),
            models=runner.slots(),
        )
        try:
            await sync_to_async(registry.beat, thread_sensitive=False)(status)
        except Exception:  # the cache is down: keep trying, the web side will call this worker dead meanwhile
            log.exception("heartbeat failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(beat_now.wait(), registry.HEARTBEAT_SECONDS)
        beat_now.clear()


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


async def _consume(
    layer: BaseChannelLayer, channel: str, model_id: str | None, runner: EngineRunner, ready: dict[str, asyncio.Event]
) -> None:
    """Work for a model waits in its shared channel until the model is loaded; the worker's inbox takes any of its
    models, and keeps taking cancels while a model loads."""
    if model_id is not None:
        await ready[model_id].wait()
    waiting: set[asyncio.Task[None]] = set()
    async for data in _messages(layer, channel):
        try:
            message = wire.decode_request(data)
        except wire.WireError as exc:
            await _refuse_malformed(layer, data, exc)
            continue
        if isinstance(message, wire.Question):
            target = model_id or message.model
            if target in ready and not ready[target].is_set():
                task = asyncio.create_task(_dispatch_when_ready(layer, message, target, runner, ready[target]))
                waiting.add(task)
                task.add_done_callback(waiting.discard)
                continue
        await _dispatch(layer, message, model_id, runner, ready)


async def _dispatch_when_ready(
    layer: BaseChannelLayer, message: wire.AnyRequest, model_id: str, runner: EngineRunner, ready: asyncio.Event
) -> None:
    await ready.wait()
    await _dispatch(layer, message, model_id, runner, {model_id: ready})


async def _dispatch(
    layer: BaseChannelLayer,
    message: wire.AnyRequest,
    model_id: str | None,
    runner: EngineRunner,
    ready: dict[str, asyncio.Event],
) -> None:
    """Hand one message to the runner; a failure is answered (when the message says where) and logged, never fatal."""
    try:
        match message:
            case wire.Cancel(request_id):
                runner.cancel(request_id)
            case wire.Next(request_id):
                runner.next_token(request_id)
            case wire.Question():
                await _answer(
                    layer, message, model_id or message.model, runner, held=(model_id or message.model) in ready
                )
    except Exception:
        log.exception("handling %s %s failed", type(message).__name__, message.request_id)


async def _answer(
    layer: BaseChannelLayer, message: wire.Generate | wire.OneShot, model_id: str, runner: EngineRunner, held: bool
) -> None:
    if not held:
        error = wire.Error(
            request_id=message.request_id,
            status=404,
            code="model_not_found",
            param="model",
            message=f"This worker does not hold {model_id!r}.",
        )
    elif model_id in runner.failures:
        error = wire.Error(
            request_id=message.request_id,
            status=503,
            code="model_unavailable",
            message=f"The model {model_id!r} could not be loaded: {runner.failures[model_id]}",
        )
    elif isinstance(message, wire.Generate):
        runner.submit(model_id, message)
        return
    else:
        runner.ask(model_id, message)
        return
    await layer.send(message.reply_to, wire.encode(error))


async def _refuse_malformed(layer: BaseChannelLayer, data: object, exc: wire.WireError) -> None:
    """A message that is not one of the wire's: logged, and answered with an error when it names where to."""
    request_id = data.get("request_id") if isinstance(data, dict) else None
    reply_to = data.get("reply_to") if isinstance(data, dict) else None
    log.error("malformed message %s: %s", request_id or "(no request id)", exc)
    if isinstance(reply_to, str) and reply_to:
        error = wire.Error(
            request_id=str(request_id or ""),
            status=400,
            code="malformed_message",
            message=f"The inference worker could not read this request: {exc}",
        )
        try:
            await layer.send(reply_to, wire.encode(error))
        except Exception:
            log.exception("answering the malformed message %s failed", request_id)
