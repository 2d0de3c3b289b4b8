"""A message that does not fit the wire fails that one request, with a clear error and a log line, never the
socket or the worker: the next request is served. A real in-process worker on the tiny model, over a real
in-memory channel layer; the faulty side is a peer that answers with a reply no worker would build."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from channels.layers import get_channel_layer
from inprocess import HI, finished_text
from inprocess import with_tiny_worker as with_worker

from inference.params import SamplingParams
from webapp.catalog import ModelRoute
from webapp.gateway import client
from webapp.gateway.errors import GatewayError
from webapp.worker import wire

FAULTY = ModelRoute("faulty", "", ())


async def faulty_peer() -> None:
    """Takes generate requests for `faulty` and answers each with a proper start, then an event that does not parse."""
    layer = get_channel_layer()
    while True:
        request = wire.decode_request(await layer.receive(FAULTY.work_channel))
        assert isinstance(request, wire.Generate)
        replies = [
            wire.encode(wire.Queued(request_id=request.request_id, control="nowhere", worker="faulty-peer", ahead=0)),
            wire.encode(
                wire.Accepted(
                    request_id=request.request_id,
                    control="nowhere",
                    worker="faulty-peer",
                    weights="none",
                    prompt_tokens=3,
                    seed=0,
                    queued=0.0,
                )
            ),
            {"type": "events", "request_id": request.request_id, "events": [{"event": "sampled", "t": "soon"}]},
        ]
        for reply in replies:
            await layer.send(request.reply_to, reply)


@pytest.fixture
def with_tiny_worker(tiny_model_path: Path) -> Callable[[Callable[[ModelRoute], Awaitable[None]]], None]:
    def run(body: Callable[[ModelRoute], Awaitable[None]]) -> None:
        with_worker(
            tiny_model_path, body, beside=faulty_peer, extra_models=[{"id": "faulty", "path": "", "aliases": []}]
        )

    return run


def test_a_reply_that_does_not_parse_fails_its_request_with_a_502_and_the_next_request_is_served(
    with_tiny_worker: Callable[[Callable[[ModelRoute], Awaitable[None]]], None], caplog: pytest.LogCaptureFixture
) -> None:
    async def body(tiny: ModelRoute) -> None:
        generation = await client.generate(FAULTY, HI, SamplingParams(max_tokens=4))
        with pytest.raises(GatewayError) as info:
            async for _ in generation.messages():
                pass
        error = info.value
        assert (error.status, error.code, error.type) == (502, "bad_worker_reply", "server_error")
        assert "$.events[0].t" in error.message
        assert await finished_text(tiny)

    with caplog.at_level(logging.ERROR, logger="roundtrip.gateway"):
        with_tiny_worker(body)
    assert any("unreadable reply" in r.getMessage() for r in caplog.records)


def test_a_request_that_does_not_parse_is_answered_with_an_error_and_the_worker_goes_on(
    with_tiny_worker: Callable[[Callable[[ModelRoute], Awaitable[None]]], None], caplog: pytest.LogCaptureFixture
) -> None:
    async def body(tiny: ModelRoute) -> None:
        layer = get_channel_layer()
        reply_to = await layer.new_channel("reply.")
        request = wire.encode(
            wire.Generate(request_id="bad", model="tiny", reply_to=reply_to, messages=HI, params=SamplingParams())
        )
        request["params"]["temperature"] = "hot"
        await layer.send(tiny.work_channel, request)
        reply = wire.decode_reply(await asyncio.wait_for(layer.receive(reply_to), 10))
        assert isinstance(reply, wire.Error) and (reply.status, reply.code, reply.request_id) == (
            400,
            "malformed_message",
            "bad",
        )
        assert "$.params.temperature" in reply.message
        assert await finished_text(tiny)

    with caplog.at_level(logging.ERROR, logger="roundtrip.worker"):
        with_tiny_worker(body)
    assert any("malformed message bad" in r.getMessage() for r in caplog.records)
