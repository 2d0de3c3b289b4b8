"""A model's state as /health, /v1/models and the page show it, whichever kind: a local model's load progress (from
its workers' reports), or an upstream model's servers (up or down, in flight, last error)."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from webapp.catalog import ModelRoute
from webapp.gateway.upstream import probe, replicas
from webapp.worker import registry, wire


async def refresh() -> None:
    """Keep probing upstream servers, and probe now those never probed, so the first answer is not a guess."""
    probe.ensure_running()
    await probe.probe_all(never_probed=True)


async def model_status(route: ModelRoute) -> dict[str, Any]:
    if route.upstream:
        return replicas.report(route)
    load = await sync_to_async(registry.model_load)(route.id)
    status: dict[str, Any] = wire.plain(load)
    return status
