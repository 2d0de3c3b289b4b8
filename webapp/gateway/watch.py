"""Publishing gateway turns to staff who watch (ws/watch/): only when someone is, checked once per request."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.core.cache import cache

if TYPE_CHECKING:
    from webapp.gateway.lifecycle import Turn
    from webapp.usage.models import UsageRecord

WATCH_GROUP = "watch"
WATCHERS_KEY = "rt:watchers"


async def watcher_joined() -> None:
    await sync_to_async(_bump)(1)


async def watcher_left() -> None:
    await sync_to_async(_bump)(-1)


def _bump(delta: int) -> None:
    cache.add(WATCHERS_KEY, 0, None)
    cache.incr(WATCHERS_KEY, delta)


async def anyone_watching() -> bool:
    return int(await sync_to_async(cache.get)(WATCHERS_KEY, 0) or 0) > 0


async def publish(frame: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(WATCH_GROUP, {"type": "watch.frame", "frame": frame})


class WatchObserver:
    """Shows every gateway turn (API, page, benchmark) to staff on the watch page, while anyone watches (the turn asks
    once, as it starts generating, and then traces an API request at `summary`): the request, the gateway's checks,
    every trace event of its first choice and its usage row, as the pipeline page's frames, each with its request id."""

    def __init__(self) -> None:
        self._watched: set[str] = set()

    async def started(self, turn: Turn) -> None:
        if not turn.watched:
            return
        self._watched.add(turn.request_id)
        ctx = turn.ctx
        await publish(
            {
                "type": "request",
                "request_id": turn.request_id,
                "source": ctx.identity.label if ctx.identity else "",
                "model": ctx.route.id if ctx.route else "",
                "endpoint": ctx.endpoint,
            }
        )
        await publish({"type": "gateway", "request_id": turn.request_id, **turn.gateway_report()})

    async def event(self, turn: Turn, index: int, event: dict[str, Any]) -> None:
        if turn.request_id in self._watched and index == 0:
            await publish({"type": "trace", "request_id": turn.request_id, "event": event})

    async def settled(self, turn: Turn, record: UsageRecord) -> None:
        if turn.request_id not in self._watched:
            return
        self._watched.discard(turn.request_id)
        await publish({"type": "usage", "request_id": turn.request_id, **turn.usage_report()})
        await publish({"type": "done", "request_id": turn.request_id})
