"""The worker's outbox: replies from the engine thread reach the channel layer in order, a step's at once."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from channels.layers import InMemoryChannelLayer

from webapp.worker import wire
from webapp.worker.outbox import Outbox


async def _pending(layer: InMemoryChannelLayer, channel: str) -> int:
    queue = layer.channels.get(channel)
    return 0 if queue is None else queue.qsize()


async def _drain(layer: InMemoryChannelLayer, channel: str) -> list[Any]:
    return [(await layer.receive(channel))["ahead"] for _ in range(await _pending(layer, channel))]


def test_a_steps_replies_are_held_until_settle_then_sent_in_order() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        layer = InMemoryChannelLayer()
        outbox = Outbox(layer, loop)
        sender = asyncio.create_task(outbox.run())

        def engine_step() -> tuple[int, int]:
            outbox.hold()
            for n in range(3):
                outbox.emit("reply.a", wire.Waiting(request_id="r", ahead=n))
            # another thread: not held
            other = threading.Thread(target=outbox.emit, args=("reply.b", wire.Waiting(request_id="r", ahead=9)))
            other.start()
            other.join()
            # the loop has had every chance to send
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), loop).result()
            held = asyncio.run_coroutine_threadsafe(_pending(layer, "reply.a"), loop).result()
            sent = asyncio.run_coroutine_threadsafe(_pending(layer, "reply.b"), loop).result()
            outbox.settle()
            return held, sent

        held, sent = await asyncio.to_thread(engine_step)
        assert (held, sent) == (0, 1)
        assert await _drain(layer, "reply.a") == [0, 1, 2]
        outbox.emit("reply.a", wire.Waiting(request_id="r", ahead=3))  # after settle, replies go straight out again
        await asyncio.sleep(0.05)
        assert await _drain(layer, "reply.a") == [3]
        sender.cancel()

    asyncio.run(scenario())
