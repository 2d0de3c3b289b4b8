"""Hands the engine thread's replies to the event loop and sends them to the channel layer, in order.

A step's replies are held and handed over at once (`hold`, `settle`), and the engine waits briefly until the loop
has passed them on, so the web side's work for a step does not land in the middle of the next forward.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer

from webapp.worker import wire

log = logging.getLogger("roundtrip.worker")
SETTLE_TIMEOUT = 0.02  # seconds the engine waits at most for the loop after a step
SETTLE_ROUNDS = 6  # loop turns after the last send: channel receive, the consumer, the response body, the transport
Item = tuple[str, dict[str, Any]]  # (channel, encoded message); an empty channel is a settle marker


class Outbox:
    """`on_undeliverable(request_id)`: a reply could not be sent (nobody reads it, or the layer failed), so the request
    it belongs to should stop."""

    def __init__(
        self,
        layer: BaseChannelLayer,
        loop: asyncio.AbstractEventLoop,
        on_undeliverable: Callable[[str], None] = lambda _: None,
    ) -> None:
        self._layer = layer
        self._loop = loop
        self._queue: asyncio.Queue[Item] = asyncio.Queue()
        self.on_undeliverable = on_undeliverable
        self._held: list[Item] | None = None  # a step's replies, kept until `settle`
        self._holder: int | None = None  # the thread whose replies are kept

    def emit(self, channel: str, message: wire.Reply) -> None:
        """Thread-safe: called from engine threads. The message is encoded here, off the event loop."""
        item = (channel, wire.encode(message))
        if self._held is not None and threading.get_ident() == self._holder:
            self._held.append(item)
            return
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def hold(self) -> None:
        """Engine thread, before it delivers a step: keep that thread's replies until `settle` hands them to the loop
        all at once. One per stream, each woke the loop, which then took the interpreter from the engine thread in the
        middle of the step's delivery, and back: a switch of threads each way per stream."""
        self._holder = threading.get_ident()
        self._held = []

    def _put_all(self, items: list[Item]) -> None:
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
                self.on_undeliverable(message.get("request_id", ""))
            except Exception:  # the layer failed: this request cannot be answered, the others may still be
                log.exception("sending to %s failed; dropping that request", channel)
                self.on_undeliverable(message.get("request_id", ""))
