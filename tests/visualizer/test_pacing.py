"""The page's frames in messages (`visualizer.pacing`): together when ready together, paced once an answer streams,
at once when something ends, nothing lost or reordered, and a closed stream cancels its source."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from visualizer.pacing import paced
from webapp.worker.wire import Finished, ForwardStep, TextDelta, Timings

PACE = 0.1


def forward(step: int) -> dict[str, Any]:
    event = ForwardStep(t=0, step=step, phase="decode", position=step, n_tokens=1, kv_length=step, duration=0)
    return {"type": "trace", "event": event}


def text(step: int) -> dict[str, Any]:
    event = TextDelta(t=0, step=step, token_id=step, token="a", text="a", pending_bytes=[], held_text="")
    return {"type": "trace", "event": event}


def finished() -> dict[str, Any]:
    timings = Timings(0, 0, 0, 0, 0, 0, 0, [], None, None)
    event = Finished(0, "length", 1, 1, 0, "", timings)
    return {"type": "trace", "event": event}


async def answer(tokens: int, every: float, end: bool = True) -> AsyncIterator[dict[str, Any]]:
    """A turn as the run yields it: its opening frames, then a token's frames every `every` seconds, then its end."""
    yield {"type": "request"}
    yield {"type": "gateway"}
    await asyncio.sleep(0.03)  # the prefill
    for step in range(tokens):
        yield forward(step)
        yield text(step)
        await asyncio.sleep(every)
    if end:
        yield finished()
        yield {"type": "usage"}
        yield {"type": "done"}


async def collect(frames: AsyncIterator[dict[str, Any]]) -> list[tuple[float, list[dict[str, Any]]]]:
    start = time.monotonic()
    return [(time.monotonic() - start, batch) async for batch in paced(frames, PACE)]


def test_every_frame_arrives_once_in_order() -> None:
    sent = asyncio.run(collect(answer(40, 0.01)))
    flat = [frame for _, batch in sent for frame in batch]
    kinds = [frame["type"] for frame in flat]
    assert kinds[:2] == ["request", "gateway"] and kinds[-2:] == ["usage", "done"] and len(flat) == 2 + 80 + 3
    steps = [frame["event"].step for frame in flat if isinstance(frame.get("event"), TextDelta)]
    assert steps == list(range(40))


def test_frames_ready_together_share_a_message_and_the_opening_is_not_delayed() -> None:
    sent = asyncio.run(collect(answer(3, 0.2)))
    first_at, first = sent[0]
    assert [frame["type"] for frame in first] == ["request", "gateway"] and first_at < 0.02
    token_at, token = sent[1]
    assert [type(frame["event"]) for frame in token] == [ForwardStep, TextDelta]
    assert token_at < 0.03 + 0.05  # the first token goes as soon as it is made


def test_a_fast_answer_goes_at_most_one_message_per_pace() -> None:
    sent = asyncio.run(collect(answer(60, 0.005, end=False)))
    streaming = [at for at, batch in sent if any(isinstance(f.get("event"), TextDelta) for f in batch)]
    gaps = [b - a for a, b in itertools.pairwise(streaming)][:-1]  # the last: the source ended
    assert len(streaming) < 60 / 4 and min(gaps) >= PACE * 0.9


def test_the_end_of_an_answer_is_not_held_back_by_the_pace() -> None:
    async def body() -> tuple[float, float]:
        start = time.monotonic()
        last_token = end = 0.0
        async for batch in paced(answer(2, 0.001), PACE):
            now = time.monotonic() - start
            if any(isinstance(f.get("event"), TextDelta) for f in batch):
                last_token = now
            if batch[-1]["type"] == "done":
                end = now
        return last_token, end

    last_token, end = asyncio.run(body())
    assert end - last_token < PACE / 2 or end == last_token


def test_closing_the_stream_cancels_its_source_and_lets_it_clean_up() -> None:
    cleaned: list[str] = []

    async def source() -> AsyncIterator[dict[str, Any]]:
        try:
            async for frame in answer(1000, 0.01):
                yield frame
        except asyncio.CancelledError:
            await asyncio.sleep(0.01)  # e.g. keeping what was written
            cleaned.append("kept")
            raise

    async def body() -> None:
        stream = paced(source(), PACE)
        await anext(stream)
        await anext(stream)
        await stream.aclose()

    asyncio.run(body())
    assert cleaned == ["kept"]


def test_a_failing_source_fails_the_stream_after_what_it_sent() -> None:
    async def source() -> AsyncIterator[dict[str, Any]]:
        yield {"type": "request"}
        raise RuntimeError("the run broke")

    async def body() -> list[list[dict[str, Any]]]:
        return [batch async for batch in paced(source(), PACE)]

    with pytest.raises(RuntimeError, match="the run broke"):
        asyncio.run(body())
