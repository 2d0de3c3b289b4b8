"""The staff watch page's side of the gateway (ws/watch/): every turn, from any interface, published to staff who watch.

The gateway knows nothing of this: `WatchObserver` subscribes to its turns (`webapp.gateway.lifecycle.observe`) and,
while anyone watches, asks a starting turn for its trace at `summary` (an API request's answer is the same; its
client reads only the events it always gets) and publishes the request, the gateway's checks, every trace event of
its first choice and its usage row as the pipeline page's frames, each with its request id.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.core.cache import cache

from webapp.gateway import cache_calls
from webapp.worker import wire

if TYPE_CHECKING:
    from webapp.gateway.lifecycle import Turn
    from webapp.usage.models import UsageRecord

WATCH_GROUP = "watch"
WATCHERS_KEY = "rt:watchers"
# Which API a turn came through, by the gateway's endpoint name: the watch page's card and request stage say it.
APIS = {
    "chat.completions": "OpenAI Chat Completions · POST /v1/chat/completions",
    "completions": "OpenAI legacy Completions · POST /v1/completions",
    "responses": "OpenAI Responses · POST /v1/responses",
    "messages": "Anthropic Messages · POST /v1/messages",
    "ws.chat": "this site's chat page · WebSocket /ws/pipeline/",
}
MAX_SHOWN_BODY = 256 * 1024  # characters of a request's JSON sent to watchers; a larger one is cut, and says so


async def watcher_joined() -> None:
    await sync_to_async(_bump)(1)


async def watcher_left() -> None:
    await sync_to_async(_bump)(-1)


def _bump(delta: int) -> None:
    cache.add(WATCHERS_KEY, 0, None)
    cache.incr(WATCHERS_KEY, delta)


async def anyone_watching() -> bool:
    """Asked by every turn as it starts."""
    return int(await cache_calls.call(cache.get, WATCHERS_KEY, 0) or 0) > 0


async def publish(frame: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(WATCH_GROUP, {"type": "watch.frame", "frame": wire.plain(frame)})


class WatchObserver:
    """Whether anyone watches is asked once per turn, as it is about to generate."""

    def __init__(self) -> None:
        self._watched: set[str] = set()

    async def starting(self, turn: Turn) -> None:
        if await anyone_watching():
            self._watched.add(turn.request_id)
            turn.trace_at_least("summary")

    async def started(self, turn: Turn) -> None:
        if turn.request_id not in self._watched:
            return
        ctx = turn.ctx
        source = ctx.identity.label if ctx.identity else ""
        await publish(
            {
                "type": "request",
                "request_id": turn.request_id,
                "source": source,
                "model": ctx.route.id if ctx.route else "",
                "endpoint": ctx.endpoint,
                "api": APIS.get(ctx.endpoint, ctx.endpoint),
                "body": _shown(ctx.request_body),
            }
        )
        await publish({"type": "gateway", "request_id": turn.request_id, **turn.gateway_report()})

    async def event(self, turn: Turn, index: int, event: wire.TraceEvent) -> None:
        if turn.request_id in self._watched and index == 0:
            await publish({"type": "trace", "request_id": turn.request_id, "event": event})

    async def settled(self, turn: Turn, record: UsageRecord) -> None:
        if turn.request_id not in self._watched:
            return
        self._watched.discard(turn.request_id)
        await publish({"type": "usage", "request_id": turn.request_id, **turn.usage_report()})
        await publish({"type": "done", "request_id": turn.request_id})


def _shown(body: dict[str, Any] | None) -> dict[str, Any] | str | None:
    """The request's JSON for the watch page: as it came, or its beginning (as text) when it is very large."""
    if body is None:
        return None
    text = json.dumps(body, ensure_ascii=False)
    if len(text) <= MAX_SHOWN_BODY:
        return body
    return f"{text[:MAX_SHOWN_BODY]}… ({len(text):,} characters in all; the rest is not shown)"
