"""The inference worker's event-loop side: load the models, consume work, send replies, beat.

The same `serve` runs inside Daphne (in-memory layer, the default) or as its own process
(`manage.py runinferenceworker`, with Redis), as many of them as there are machines or
GPUs. Each worker consumes its own inbox (the channel its heartbeat names, where the
gateway sends it work) and the shared work channel of every model it holds; it beats
every second so the web side can route to it and notices within seconds when it dies.
Replies from the engine thread pass through one outbox task, so each request's messages
reach the channel layer in order.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings

from inference.loader import LoadedModel, load_model
from inference.progress import LoadProgress, ProgressCallback, terminal_progress
from inference.scheduler import SchedulerConfig
from webapp.gateway.routing import ModelRoute, configured_models
from webapp.worker import registry
from webapp.worker.protocol import WorkerStatus
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


def _publisher(model_id: str, terminal: ProgressCallback | None) -> ProgressCallback:
    def publish(p: LoadProgress) -> None:
        state = "ready" if p.stage == "building" and p.fraction == 1.0 else "loading"
        registry.publish_load(
            model_id, {"state": state, "stage": p.stage, "done": p.done, "total": p.total, "detail": p.detail}
        )
        if terminal is not None:
            terminal(p)

    return publish


SETTLE_TIMEOUT = 0.02  # seconds the engine waits at most for the loop after a step
SETTLE_ROUNDS = 6  # loop turns after the last send: channel receive, the consumer, the response body, the transport


class Outbox:
    """Hands replies from engine threads to the event loop and sends them in order."""

    def __init__(self, layer: BaseChannelLayer, loop: asyncio.AbstractEventLoop) -> None:
        self._layer = layer
        self._loop = loop
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.runner: EngineRunner | None = None
        self._held: list[tuple[str, dict[str, Any]]] | None = None  # a step's replies, kept until `settle`
        self._holder: int | None = None  # the thread whose replies are kept

    def emit(self, channel: str, message: Mapping[str, Any]) -> None:
        """Thread-safe: called from engine threads."""
        if self._held is not None and threading.get_ident() == self._holder:
            self._held.append((channel, dict(message)))
            return
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (channel, dict(message)))

    def hold(self) -> None:
        """Engine thread, before it delivers a step: keep that thread's replies until `settle` hands them to the loop
        all at once. One per stream, each woke the loop, which then took the interpreter from the engine thread in the
        middle of the step's delivery, and back: a switch of threads each way per stream."""
        self._holder = threading.get_ident()
        self._held = []

    def _put_all(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        for item in items:
            self._queue.put_nowait(item)

    def settle(self) -> None:
        """Engine thread, after a step: wait (briefly) until the event loop has passed this step's replies on.

        On a small machine the loop's work for a step (a reply per stream, each becoming an SSE chunk or a
        socket frame) would otherwise land in the middle of the next forward, and every preemption of one of
        torch's threads stalls the other at its next barrier: at 8 streams on 2 cores that cost 9 ms a step.
        Done back to back, the same work costs only its own time."""
        held, self._held = self._held or [], None
        done = threading.Event()
        self._loop.call_soon_threadsafe(self._put_all, [*held, ("", {"settled": done})])
        done.wait(SETTLE_TIMEOUT)

    async def run(self) -> None:
        while True:
            channel, message = await self._queue.get()
            if not channel:  # a settle marker: let the consumers that were just woken run, then release the engine
                for _ in range(SETTLE_ROUNDS):
                    await asyncio.sleep(0)
                message["settled"].set()
                continue
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
    """Load the models (on the engine thread), then answer work until cancelled, beating all along."""
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is not configured"
    loop = asyncio.get_running_loop()
    routes = routes or configured_models()
    outbox = Outbox(layer, loop)
    inbox = await layer.new_channel("inference-worker.")
    worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    ready = {route.id: asyncio.Event() for route in routes}

    def loader(route: ModelRoute) -> Callable[[], LoadedModel]:
        progress = _publisher(route.id, terminal_progress() if show_progress else None)

        def load() -> LoadedModel:
            try:
                loaded = load_model(route.path or None, progress=progress)
            except Exception as exc:
                registry.publish_load(route.id, {"state": "failed", "detail": str(exc)})
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
                {
                    "state": "ready",
                    "stage": "building",
                    "done": 2,
                    "total": 2,
                    "detail": "ready",
                    "weights": loaded.weights_description,
                    "device": str(loaded.device),
                },
            )
            return loaded

        return load

    def on_ready(model_id: str) -> None:
        loop.call_soon_threadsafe(ready[model_id].set)

    runner = EngineRunner(
        {route.id: loader(route) for route in routes},
        on_ready,
        outbox.emit,
        inbox,
        scheduler_config(),
        worker_id,
        outbox.settle,
        outbox.hold,
    )
    outbox.runner = runner
    tasks = [
        asyncio.create_task(outbox.run()),
        asyncio.create_task(_heartbeat(worker_id, inbox, runner)),
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


async def _heartbeat(worker_id: str, inbox: str, runner: EngineRunner) -> None:
    """Tell the web side, every second, that this worker is alive and what it holds (from its first second)."""
    while True:
        status: WorkerStatus = {
            "worker": worker_id,
            "channel": inbox,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "t": time.time(),
            "models": runner.slots(),
        }
        try:
            await sync_to_async(registry.beat, thread_sensitive=False)(status)
        except Exception:  # the cache is down: keep trying, the web side will call this worker dead meanwhile
            log.exception("heartbeat failed")
        await asyncio.sleep(registry.HEARTBEAT_SECONDS)


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
    """Work for a model waits in its shared channel until the model is loaded; the worker's inbox takes any of its models."""
    if model_id is not None:
        await ready[model_id].wait()
    waiting: set[asyncio.Task[None]] = set()
    async for message in _messages(layer, channel):
        target = model_id or str(message.get("model", ""))
        if target in ready and not ready[target].is_set():  # the inbox must keep taking cancels while a model loads
            task = asyncio.create_task(_dispatch_when_ready(layer, message, target, runner, ready[target]))
            waiting.add(task)
            task.add_done_callback(waiting.discard)
            continue
        await _dispatch(layer, message, target, runner, target in ready)


async def _dispatch_when_ready(
    layer: BaseChannelLayer, message: dict[str, Any], model_id: str, runner: EngineRunner, ready: asyncio.Event
) -> None:
    await ready.wait()
    await _dispatch(layer, message, model_id, runner, True)


async def _dispatch(
    layer: BaseChannelLayer, message: dict[str, Any], model_id: str, runner: EngineRunner, held: bool
) -> None:
    """Hand one message to the runner; a malformed one is logged, never fatal."""
    try:
        await _route(layer, message, model_id, runner, held)
    except Exception:
        log.exception("bad message for %s", model_id)


async def _route(
    layer: BaseChannelLayer, message: dict[str, Any], model_id: str, runner: EngineRunner, held: bool
) -> None:
    kind = message.get("type")
    if kind == "cancel":
        runner.cancel(str(message.get("request_id", "")))
        return
    if kind == "next":
        runner.next_token(str(message.get("request_id", "")))
        return
    if not held:
        await layer.send(
            message["reply_to"],
            {
                "type": "error",
                "request_id": message.get("request_id"),
                "status": 404,
                "code": "model_not_found",
                "message": f"This worker does not hold {model_id!r}.",
                "param": "model",
            },
        )
        return
    if model_id in runner.failures:
        reason = f"The model {model_id!r} could not be loaded: {runner.failures[model_id]}"
        await layer.send(
            message["reply_to"],
            {
                "type": "error",
                "request_id": message.get("request_id"),
                "status": 503,
                "code": "model_unavailable",
                "message": reason,
                "param": None,
            },
        )
    elif kind == "generate":
        runner.submit(model_id, message)  # type: ignore[arg-type]
    elif kind == "tokenize":
        runner.tokenize(model_id, message)  # type: ignore[arg-type]
    elif kind == "detokenize":
        runner.detokenize(model_id, message)  # type: ignore[arg-type]
    elif kind == "inspect":
        runner.inspect(model_id, message)  # type: ignore[arg-type]
    elif kind == "resample":
        runner.resample(model_id, message)  # type: ignore[arg-type]
    elif kind == "prompt_attention":
        runner.prompt_attention(model_id, message)  # type: ignore[arg-type]
    else:
        log.warning("ignoring message of type %r for %s", kind, model_id)
