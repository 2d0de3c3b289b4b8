"""A real inference worker in this process, serving the tiny model over a fresh in-memory channel layer, for tests
that drive the gateway's side of the wire (the client, a Turn) against it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from channels import layers as channel_layers
from django.test import override_settings
from load_settings import CPU
from loops import run_async

from inference.params import SamplingParams
from webapp.catalog import ModelRoute
from webapp.gateway import client
from webapp.worker import registry, wire
from webapp.worker.service import serve

HI = [{"role": "user", "content": "hi"}]


async def worker_ready(model_id: str, patience: float = 60) -> None:
    """Until a live worker holds `model_id` (a model's load state may still say "ready" from an earlier worker)."""
    deadline = time.monotonic() + patience
    while not await sync_to_async(registry.live_workers)(model_id):
        assert time.monotonic() < deadline, f"no worker took {model_id} in {patience} s"
        await asyncio.sleep(0.05)


async def finished_text(route: ModelRoute) -> str:
    """One short greedy answer through the client: its text, once every event arrived."""
    generation = await client.generate(route, HI, SamplingParams(temperature=0.0, max_tokens=4))
    events = [m.event async for m in generation.messages() if isinstance(m, client.ChoiceEvent)]
    assert isinstance(events[-1], wire.Finished)
    return events[-1].text


def with_tiny_worker(
    tiny_model_path: Path,
    body: Callable[[ModelRoute], Awaitable[None]],
    beside: Callable[[], Coroutine[Any, Any, None]] | None = None,
    **settings: Any,
) -> None:
    """Run `body(route)` once the worker answers (and `beside()` as a task next to it), with `settings` overridden."""
    route = ModelRoute("tiny", str(tiny_model_path), ())

    async def main() -> None:
        channel_layers.backends = {}  # a fresh in-memory layer for this event loop
        tasks = [asyncio.create_task(serve([route], show_progress=False))]
        if beside is not None:
            tasks.append(asyncio.create_task(beside()))
        try:
            await worker_ready(route.id)
            await finished_text(route)  # loaded, warm and answering
            await body(route)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    models = [{"id": "tiny", "path": str(tiny_model_path), "aliases": []}, *settings.pop("extra_models", [])]
    with override_settings(ROUNDTRIP_MODELS=models, ROUNDTRIP_LOAD=CPU, **settings):
        run_async(main())
