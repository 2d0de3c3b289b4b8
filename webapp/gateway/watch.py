"""Publishing API requests to staff who watch (ws/watch/): only when someone is, checked once per request."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.core.cache import cache

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
