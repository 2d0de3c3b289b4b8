"""The health probe: every `ROUNDTRIP_UPSTREAM_PROBE_SECONDS`, each upstream server is asked whether it is ready:
`GET /health` at its root (llama-server, vLLM, SGLang and Roundtrip answer 200 only once their model is loaded, and
log no request), or, for a server without one (hosted APIs), `GET /v1/models`. One that fails is left out for the
cooldown, one that answers is back in rotation. A server several entries share is asked once per round. One probing
task per event loop, started by the first request that needs upstream state (a generation, /health, /v1/models).
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
    """Probe every server (or only those never probed yet), all at once, each URL once."""
    due: dict[str, list[Upstream]] = {}
    for upstream in servers():
        if not never_probed or replicas.state(upstream).last_probe is None:
            due.setdefault(upstream.url, []).append(upstream)
    await asyncio.gather(*(probe(entries) for entries in due.values()))


_no_health: set[str] = set()  # servers whose root has no /health: asked for /v1/models instead


async def _ready(upstream: Upstream) -> tuple[bool, str]:
    """Whether the server says it is ready, and what it answered."""
    health = upstream.url not in _no_health
    url = upstream.root + "/health" if health else upstream.url + "/models"
    async with connection.http().get(url, headers=connection.headers(upstream), timeout=PROBE_TIMEOUT) as response:
        await response.read()
        if health and response.status == 404:
            _no_health.add(upstream.url)
            return await _ready(upstream)
        return response.status == 200, f"probe: {url.rsplit('/', 1)[-1]} answered HTTP {response.status}"


async def probe(entries: list[Upstream]) -> bool:
    """One probe of one server (the entries that name it): True when it is ready."""
    started = time.perf_counter()
    try:
        ok, why = await _ready(entries[0])
    except connection.FAILURES as exc:
        ok, why = False, f"probe: {connection.why(exc)}"
    for upstream in entries:
        _record(upstream, ok, why, (time.perf_counter() - started) * 1000)
    return ok


def _record(upstream: Upstream, ok: bool, why: str, ms: float) -> None:
    state = replicas.state(upstream)
    state.last_probe = time.monotonic()
    if ok:
        state.probe_ms = round(ms, 2)
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
        metrics.labelled(metrics.upstream_failures, upstream.name, "probe").inc()
    metrics.labelled(metrics.upstream_up, upstream.name).set(1 if ok else 0)
