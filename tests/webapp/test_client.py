"""The web side's channel-layer client: a failing or silent layer becomes a 503 in the API's own format."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.core.cache import cache
from django.test import override_settings
from loops import run_async

from inference.params import SamplingParams
from webapp.catalog import ModelRoute
from webapp.gateway import client
from webapp.gateway.errors import GatewayError

ROUTE = ModelRoute("tiny", "", ())


class BrokenLayer:
    async def new_channel(self, prefix: str = "") -> str:
        return prefix + "x"

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        raise ConnectionError("Redis is down")

    async def receive(self, channel: str) -> dict[str, Any]:
        raise ConnectionError("Redis is down")


class SilentLayer(BrokenLayer):
    async def send(self, channel: str, message: dict[str, Any]) -> None:
        return None

    async def receive(self, channel: str) -> dict[str, Any]:
        import asyncio

        await asyncio.sleep(3600)
        return {}


@pytest.mark.parametrize("layer, code", [(BrokenLayer(), "channel_layer_error"), (SilentLayer(), "worker_timeout")])
def test_a_broken_or_silent_layer_is_a_503_with_retry_after(
    monkeypatch: pytest.MonkeyPatch, layer: Any, code: str
) -> None:
    cache.clear()  # no worker has reported yet (an earlier test's may still say "ready"): the request goes to the layer
    monkeypatch.setattr(client, "get_channel_layer", lambda: layer)
    with override_settings(ROUNDTRIP_WORKER_TIMEOUT=0.2), pytest.raises(GatewayError) as info:
        run_async(client.generate(ROUTE, [{"role": "user", "content": "hi"}], SamplingParams()))
    assert info.value.status == 503 and info.value.code == code and "Retry-After" in info.value.headers


def test_a_model_no_worker_ever_started_loading_is_a_503_after_the_start_timeout() -> None:
    """On the real (in-memory) layer with no worker at all: refused as `no_worker` once ROUNDTRIP_WORKER_START_TIMEOUT
    has passed, not after the 120 s a worker that took the job may stay silent."""
    cache.clear()  # no heartbeat, no load progress: nobody has started loading the model
    started = time.monotonic()
    with (
        override_settings(ROUNDTRIP_WORKER_START_TIMEOUT=0.3, ROUNDTRIP_WORKER_TIMEOUT=120),
        pytest.raises(GatewayError) as info,
    ):
        run_async(client.generate(ROUTE, [{"role": "user", "content": "hi"}], SamplingParams()))
    assert info.value.status == 503 and info.value.code == "no_worker" and "Retry-After" in info.value.headers
    assert 0.3 <= time.monotonic() - started < 3
