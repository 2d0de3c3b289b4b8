"""The page's frames in messages: those ready together go as one, and once an answer streams, at most one message
per `PACE_S`.

Every WebSocket message costs the browser about the same whatever its size (the network process, an IPC hop, a task
on the page's main thread), and on a machine where the browser and the engine share the cores, the engine pays for
that time twice: its threads wait for each other at every layer while one of them is off its core. Measured with
`benchmarks/bench_page.py` (docs/page.md): one message per frame made a 256-token answer about 1.5x slower through the
page than over SSE; one per token, 1.45x; paced at 150 ms, about 1.25x. The page draws at most every 150 ms, so a
faster pace would only be drawn later. Frames that end something (the answer's last token, usage, done, an error) and
everything up to the first token go at once: the page's clocks for time to first token and the end of the turn are
not delayed. API clients are not paced: SSE sends each token as it is made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from webapp.worker.wire import Finished, TextDelta

PACE_S = 0.15

Frame = dict[str, Any]


def _urgent(frame: Frame | None) -> bool:
    """A frame the page should see at once: the end of the stream, of the answer, or of the turn."""
    return frame is None or frame["type"] in ("usage", "done", "error") or isinstance(frame.get("event"), Finished)


async def paced(frames: AsyncIterator[Frame], pace_s: float = PACE_S) -> AsyncGenerator[list[Frame], None]:
    """`frames` in batches: each batch is every frame ready when the previous one was taken, and once the first
    token's text went, the next batch waits until `pace_s` after the last one unless an urgent frame comes first.
    Closing this generator (the socket went) cancels the reading of `frames`, as if its reader had been cancelled."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Queue[Frame | None] = asyncio.Queue()
    urgent = asyncio.Event()

    async def produce() -> None:
        try:
            async for frame in frames:
                ready.put_nowait(frame)
                if _urgent(frame):
                    urgent.set()
        finally:
            ready.put_nowait(None)
            urgent.set()

    producer = asyncio.create_task(produce())
    streaming = False
    last = -pace_s
    try:
        while True:
            batch = [await ready.get()]
            wait = last + pace_s - loop.time()
            if streaming and wait > 0 and not urgent.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(urgent.wait(), wait)
            while not ready.empty():
                batch.append(ready.get_nowait())
            urgent.clear()
            out = [frame for frame in batch if frame is not None]
            if out:
                yield out
                last = loop.time()
                streaming = streaming or any(isinstance(frame.get("event"), TextDelta) for frame in out)
            if batch[-1] is None:
                break
    finally:
        if not producer.done():
            producer.cancel()
        await asyncio.wait([producer])  # its own clean-up (a stopped turn is kept) runs before this returns
    producer.result()  # what went wrong in the run, if anything, is raised here
