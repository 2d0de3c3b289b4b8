"""The staff watch observer: while anyone watches, a starting turn is asked for its trace, and its request, gateway
checks, first choice's events and usage row are published to the watch group, as the page's frames."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from channels.layers import get_channel_layer
from django.core.cache import cache
from inprocess import HI, with_tiny_worker
from loops import run_async

from inference.params import SamplingParams
from visualizer.watch import WATCH_GROUP, WatchObserver, anyone_watching, watcher_joined, watcher_left
from webapp.catalog import ModelRoute
from webapp.gateway import lifecycle
from webapp.gateway.identity import identify_session
from webapp.gateway.lifecycle import Turn

pytestmark = pytest.mark.django_db(transaction=True)
UNLIMITED: dict[str, Any] = {"ROUNDTRIP_ANONYMOUS_LIMITS": {}, "ROUNDTRIP_ANONYMOUS_ADDRESS_LIMITS": {}}


async def one_turn() -> Turn:
    turn = Turn("test.watch", "127.0.0.1")
    turn.authenticated(identify_session(None, "watch-test", "127.0.0.1"), time.perf_counter())
    await turn.admit("tiny")
    await turn.generate(HI, SamplingParams(temperature=0.0, max_tokens=3), n=2)
    async for _ in turn.messages():
        pass
    await turn.settle()
    return turn


async def frames_in(channel: str) -> list[dict[str, Any]]:
    """Every frame published to `channel` so far."""
    layer = get_channel_layer()
    frames = []
    while (queue := layer.channels.get(channel)) is not None and not queue.empty():
        frames.append((await layer.receive(channel))["frame"])
    return frames


def test_while_someone_watches_a_turn_is_traced_and_published_frame_by_frame(tiny_model_path: Path) -> None:
    """The visualizer app subscribes its WatchObserver as it starts (`VisualizerConfig.ready`)."""
    assert any(isinstance(o, WatchObserver) for o in lifecycle.observers())
    seen: dict[str, Any] = {}

    async def body(route: ModelRoute) -> None:
        layer = get_channel_layer()
        channel = await layer.new_channel("watcher.")
        await layer.group_add(WATCH_GROUP, channel)
        await watcher_joined()
        try:
            turn = await one_turn()
            seen["level"], seen["frames"] = turn.level, await frames_in(channel)
        finally:
            await watcher_left()
        seen["unwatched"] = (await one_turn()).level
        seen["after"] = await frames_in(channel)

    with_tiny_worker(tiny_model_path, body, **UNLIMITED)
    frames = seen["frames"]
    kinds = [f["type"] for f in frames]
    assert seen["level"] == "summary" and seen["unwatched"] == "off" and seen["after"] == []
    assert kinds[:2] == ["request", "gateway"] and kinds[-2:] == ["usage", "done"]
    traces = [f["event"] for f in frames if f["type"] == "trace"]
    assert traces[0]["event"] == "tokenized" and traces[-1]["event"] == "finished"  # the first choice's, as plain JSON
    assert sum(t["event"] == "finished" for t in traces) == 1  # of two choices, only the first is shown
    assert frames[-2]["record"]["status"] == 200 and all(f["request_id"] == frames[0]["request_id"] for f in frames)


def test_watchers_are_counted_as_they_come_and_go() -> None:
    cache.delete("rt:watchers")

    async def scenario() -> list[bool]:
        states = [await anyone_watching()]
        await watcher_joined()
        await watcher_joined()
        states.append(await anyone_watching())
        await watcher_left()
        states.append(await anyone_watching())
        await watcher_left()
        states.append(await anyone_watching())
        return states

    assert run_async(scenario()) == [False, True, True, False]
