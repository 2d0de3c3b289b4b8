"""The health probe: every `ROUNDTRIP_UPSTREAM_PROBE_SECONDS`, each upstream server is asked for its model list
(`GET /v1/models`, which llama-server, vLLM, Roundtrip and hosted APIs all answer); one that fails is left out for the
cooldown, one that answers is back in rotation. One probing task per event loop, started by the first request that
needs upstream state (a generation, /health, /v1/models).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref

import aiohttp
from django.conf import settings

from webapp.catalog import Upstream, configured_models
from webapp.gateway.upstream import connection, replicas
from webapp.metrics import metrics

log = logging.getLogger("roundtrip.gateway")
_tasks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = weakref.WeakKeyDictionary()
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


def servers() -> list[Upstream]:
    return [upstream for route in configured_models() for upstream in route.replicas]


def ensure_running() -> None:
    """Start this loop's probing task, once, when there is any upstream server to probe."""
    loop = asyncio.get_running_loop()
    task = _tasks.get(loop)
    if (task is None or task.done()) and servers():
        _tasks[loop] = loop.create_task(_probe_forever())


async def _probe_forever() -> None:
    while True:
        await probe_all()
        await asyncio.sleep(settings.ROUNDTRIP_UPSTREAM_PROBE_SECONDS)


async def probe_all(never_probed: bool = False) -> None:
    """Probe every server (or only those never probed yet), all at once."""
    due = [u for u in servers() if not never_probed or replicas.state(u).last_probe is None]
    await asyncio.gather(*(probe(u) for u in due))


async def probe(upstream: Upstream) -> bool:
    """One probe: True when the server answered its model list."""
    state = replicas.state(upstream)
    started = time.perf_counter()
    try:
        async with connection.http().get(
            upstream.url + "/models", headers=connection.headers(upstream), timeout=PROBE_TIMEOUT
        ) as response:
            await response.read()
            ok, why = response.status == 200, f"probe: HTTP {response.status}"
    except connection.FAILURES as exc:
        ok, why = False, f"probe: {connection.why(exc)}"
    state.last_probe = time.monotonic()
    if ok:
        state.probe_ms = round((time.perf_counter() - started) * 1000, 2)
        if not state.up or state.failures:
            log.info("upstream %s answers its probe: back in rotation", upstream.name)
        replicas.succeeded(upstream)
    else:
        state.probe_ms = None
        if state.up:
            log.warning(
                "upstream %s failed its probe (%s): left out for %s s",
                upstream.name,
                why,
                settings.ROUNDTRIP_UPSTREAM_COOLDOWN,
            )
        replicas.failed(upstream, why)
        metrics.upstream_failures.labels(upstream.name, "probe").inc()
    metrics.upstream_up.labels(upstream.name).set(1 if ok else 0)
    return ok
