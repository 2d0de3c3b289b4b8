"""The web side's handle on a generation: pick a worker, send the request over the channel layer, read the replies.

Nothing here imports torch: the model lives in an inference worker, in this process
(in-memory layer) or another one (Redis). The worker is chosen from the heartbeats
(`webapp.worker.registry`); while waiting for replies the client keeps an eye on that
worker's heartbeat, so a worker that dies mid-stream is an error within seconds, not a hang.
Every reply is parsed into its wire class (`webapp.worker.wire`); one that does not parse
fails its request with a 502 and a log line.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings

from inference.params import SamplingParams
from webapp.catalog import ModelRoute
from webapp.gateway.errors import GatewayError
from webapp.gateway.upstream import tokenizer as upstream_tokenizer
from webapp.worker import registry, wire

log = logging.getLogger("roundtrip.gateway")
R = TypeVar("R", bound=wire.Reply)
Q = TypeVar("Q", bound=wire.Question)


def new_request_id(prefix: str = "chatcmpl-") -> str:
    """An id as each API writes them: `chatcmpl-…` for chat, `cmpl-…` for legacy completions, `msg_…` for messages."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


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


def _no_worker(model: str, load: wire.ModelLoad) -> GatewayError:
    """No live worker serves `model`, and none is loading it: an answer now, not a wait for the worker timeout."""
    if load.state == "failed":
        return GatewayError(
            503,
            f"The model {model!r} could not be loaded: {load.detail}",
            "server_error",
            "model_unavailable",
            headers={"Retry-After": "30"},
        )
    why = load.detail or f"no inference worker holding {model} has reported"
    return GatewayError(
        503,
        f"No inference worker serves {model!r} now ({why}); retry shortly.",
        "server_error",
        "no_worker",
        headers={"Retry-After": "5"},
    )


def _worker_lost(worker: str) -> GatewayError:
    return GatewayError(
        503,
        f"The inference worker {worker} stopped answering (no heartbeat for {registry.HEARTBEAT_TTL} s); retry.",
        "server_error",
        "worker_lost",
        headers={"Retry-After": "1"},
    )


async def _send(layer: BaseChannelLayer, channel: str, message: wire.Wire) -> None:
    try:
        await layer.send(channel, wire.encode(message))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise _layer_failed(exc) from exc


def _raise_for(reply: wire.AnyReply) -> None:
    if isinstance(reply, wire.Error):
        headers = {"Retry-After": str(reply.retry_after)} if reply.retry_after is not None else {}
        kind = "invalid_request_error" if reply.status < 500 else "server_error"
        raise GatewayError(reply.status, reply.message, kind, reply.code, reply.param, headers)


class Replies:
    """The replies on one channel, read without ever cancelling a receive (cancel-safe on every layer), while
    watching the worker's heartbeat: a dead worker raises `worker_lost`, a silent live one `worker_timeout`. Before a
    worker has taken the request (sent to the model's shared channel), the model's load state is watched instead: a
    model nobody serves any more raises `no_worker` within a heartbeat, one that no worker has started loading after
    `ROUNDTRIP_WORKER_START_TIMEOUT` seconds too."""

    def __init__(self, layer: BaseChannelLayer, channel: str, worker: str | None, model: str = "") -> None:
        self.layer = layer
        self.channel = channel
        self.worker = worker
        self.model = model
        self.started = time.monotonic()
        self._receiving: asyncio.Task[dict[str, Any]] | None = None

    async def next(self, patient: bool = False) -> wire.AnyReply:
        """The next reply, parsed; an error reply raises its GatewayError."""
        data = await self._receive(patient)
        try:
            reply = wire.decode_reply(data)
        except wire.WireError as exc:
            request_id = data.get("request_id") if isinstance(data, dict) else None
            log.error("unreadable reply from worker %s for %s: %s", self.worker, request_id, exc)
            raise GatewayError(
                502,
                f"The inference worker sent a reply this server cannot read ({exc}).",
                "server_error",
                "bad_worker_reply",
            ) from None
        _raise_for(reply)
        return reply

    async def _receive(self, patient: bool) -> dict[str, Any]:
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
            if self.worker is None and self.model:
                await self._check_someone_serves()
            if deadline is not None and time.monotonic() > deadline:
                raise GatewayError(
                    503,
                    "The inference worker did not answer in time; retry shortly.",
                    "server_error",
                    "worker_timeout",
                    headers={"Retry-After": "5"},
                )

    async def _check_someone_serves(self) -> None:
        load = await sync_to_async(registry.model_load, thread_sensitive=False)(self.model)
        waited = time.monotonic() - self.started
        if load.state in ("unavailable", "failed") or (
            load.state == "not started" and waited > settings.ROUNDTRIP_WORKER_START_TIMEOUT
        ):
            raise _no_worker(self.model, load)

    def close(self) -> None:
        if self._receiving is not None:
            self._receiving.cancel()
            self._receiving = None


async def _target(route: ModelRoute) -> tuple[str, str | None]:
    """Where to send work for `route`: the least-loaded live worker's inbox (counted in `registry.in_flight`
    until the caller's Generation closes), or, before any worker has reported, the model's shared channel.
    Whether there is room is the worker's call (heartbeats are up to a second old). An upstream model has no
    workers here: what only a worker can answer (the page's looks inside the model) is refused."""
    if route.upstream:
        raise GatewayError(
            400,
            f"{route.id!r} runs on an upstream server: what happens inside it cannot be seen from here.",
            "invalid_request_error",
            "upstream_model",
            "model",
        )
    workers = await sync_to_async(registry.live_workers, thread_sensitive=False)(route.id)
    worker = registry.pick(workers, route.id)
    if worker is None:
        load = await sync_to_async(registry.model_load, thread_sensitive=False)(route.id)
        if load.state in ("unavailable", "failed"):  # it was served and its workers are gone, or it could not load
            raise _no_worker(route.id, load)
        return route.work_channel, None
    registry.in_flight[worker.worker] += 1
    return worker.channel, worker.worker


@dataclass(frozen=True)
class ChoiceEvent:
    """A trace event of one choice (`index`, for n > 1)."""

    index: int
    event: wire.TraceEvent


class Generation:
    """One request's replies. `start()` waits until the worker accepted it (or raises its error)."""

    def __init__(self, layer: BaseChannelLayer, request: wire.Generate, worker: str | None) -> None:
        self.layer = layer
        self.request = request
        self.request_id = request.request_id
        self.replies = Replies(layer, request.reply_to, worker, request.model)
        self.control: str | None = None
        self.worker = worker
        self.accepted: wire.Accepted | None = None
        self.finished: wire.Finished | None = None  # set once every choice finished (the first choice's event)
        self.finished_choices: dict[int, wire.Finished] = {}
        self.cancelled = False
        self.closed = False  # the worker's place in registry.in_flight (taken by _target) is given back on close

    async def start(self) -> wire.Accepted:
        while True:
            reply = await self.replies.next()
            if isinstance(reply, wire.Queued):
                self._queued(reply)
            elif isinstance(reply, wire.Accepted):
                self.control, self.accepted = reply.control, reply
                return reply

    def _queued(self, reply: wire.Queued) -> None:
        self.control = reply.control
        if self.worker is None:  # sent to the shared channel: now we know who took it
            self.worker = self.replies.worker = reply.worker
            registry.in_flight[self.worker] += 1

    async def messages(self) -> AsyncIterator[wire.Waiting | ChoiceEvent]:
        """Every reply until the end: "waiting" updates and, one by one, each choice's trace events; an error reply
        raises GatewayError."""
        try:
            while self.finished is None:
                reply = await self.replies.next(patient=self.request.step)
                if isinstance(reply, wire.Cancelled):
                    self.cancelled = True
                    return
                if isinstance(reply, wire.Waiting):
                    yield reply
                elif isinstance(reply, wire.Events):
                    for event in reply.events:
                        if isinstance(event, wire.Finished):
                            self._finished(reply.index, event)
                        yield ChoiceEvent(reply.index, event)
        finally:
            self.close()

    def _finished(self, index: int, event: wire.Finished) -> None:
        self.finished_choices[index] = event
        if len(self.finished_choices) == self.request.n:
            self.finished = self.finished_choices.get(0, event)

    async def next_token(self) -> None:
        """Step mode: let the worker produce the next token."""
        if self.control and self.finished is None:
            await _send(self.layer, self.control, wire.Next(request_id=self.request_id))

    async def cancel(self) -> None:
        """Tell the worker to stop (the client left or asked); harmless once it has finished."""
        if self.control and self.finished is None and not self.cancelled:
            try:
                await self.layer.send(self.control, wire.encode(wire.Cancel(request_id=self.request_id)))
            except Exception:  # best effort: a worker that cannot be told drops the request when its replies bounce
                log.warning("telling %s to stop %s failed", self.worker, self.request_id)

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
    level: wire.Level = "off",
    request_id: str | None = None,
    **options: Any,
) -> Generation:
    """Send a generate request to the model's least-loaded worker and wait until it is accepted. `options` are the
    wire's Generate fields: `prompt` (raw text instead of `messages`, without the chat template), `n` choices,
    `tools`, `continue_final`, `step`, `truncate_history`, `fit_max_tokens`."""
    layer = _layer()
    reply_to = await layer.new_channel("reply.")
    channel, worker = await _target(route)
    request = wire.Generate(
        request_id=request_id or new_request_id(),
        model=route.id,
        reply_to=reply_to,
        messages=messages,
        params=params,
        level=level,
        sent_at=time.time(),
        **options,
    )
    generation = Generation(layer, request, worker)
    try:
        await _send(layer, channel, request)
        await generation.start()
    except BaseException:  # the client left, or the worker refused: make sure nothing keeps running
        await generation.cancel()
        generation.close()
        raise
    return generation


async def _ask(route: ModelRoute, question: type[Q], answer: type[R], **fields: Any) -> R:
    """One question (see `webapp.worker.questions`) with `fields`, one reply of type `answer`."""
    layer = _layer()
    reply_to = await layer.new_channel("reply.")
    channel, worker = await _target(route)
    replies = Replies(layer, reply_to, worker, route.id)
    try:
        await _send(layer, channel, question(request_id=new_request_id(), model=route.id, reply_to=reply_to, **fields))
        while True:
            reply = await replies.next()
            if isinstance(reply, answer):
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
) -> wire.Tokens:
    """Ids and token strings for plain `text`, or for `messages` (and `tools`) rendered with the model's chat
    template (an upstream model's by its server's own tokenizer)."""
    if route.upstream:
        return await upstream_tokenizer.tokenize(route, text, messages, tools)
    if messages is not None:
        return await _ask(route, wire.Tokenize, wire.Tokens, messages=messages, tools=tools or None)
    return await _ask(route, wire.Tokenize, wire.Tokens, text=text or "")


async def detokenize(route: ModelRoute, ids: list[int]) -> str:
    if route.upstream:
        return await upstream_tokenizer.detokenize(route, ids)
    return (await _ask(route, wire.Detokenize, wire.Detokenized, ids=ids)).text


async def next_tokens(route: ModelRoute, text: str) -> wire.NextTokenView:
    """`text` read raw by the worker's model: its tokens and the likeliest next ones."""
    return await _ask(route, wire.NextTokens, wire.NextTokenView, text=text)


async def merges(route: ModelRoute, text: str) -> wire.MergeSteps:
    """The merges that build the tokens of `text`, by the worker's tokenizer."""
    return await _ask(route, wire.Merges, wire.MergeSteps, text=text)


async def inspect(route: ModelRoute, ids: list[int]) -> wire.LayerDetail:
    """Full-level detail (attention, norms, logit lens) for the last of `ids`, recomputed by the worker."""
    return (await _ask(route, wire.Inspect, wire.Inspection, ids=ids)).detail


async def prompt_attention(route: ModelRoute, ids: list[int], layer: int) -> wire.Attention:
    """The prefill's token x token attention at `layer` for the prompt `ids` (its first 256 positions), by the
    worker."""
    return (await _ask(route, wire.PromptAttention, wire.PromptAttentionMatrix, ids=ids, layer=layer)).attention


async def resample(
    route: ModelRoute, prompt_ids: list[int], generated: list[int], params: SamplingParams
) -> wire.Sampled:
    """The sampled event of a past step drawn again with `params` (after `prompt_ids` + `generated`), by the worker."""
    return (
        await _ask(route, wire.Resample, wire.Resampled, prompt_ids=prompt_ids, generated=generated, params=params)
    ).event
