"""Which inference workers are alive, what they hold, and which one should take the next request.

Workers beat every `HEARTBEAT_SECONDS` into the Django cache (Redis when scaled out, so
every web process sees every worker; local memory in the embedded default, where the
worker lives in the web process). A worker whose beat is older than `HEARTBEAT_TTL`
is gone: the web side fails its in-flight requests and routes around it. Torch-free.
Beats and load progress are kept as their wire dicts and read back through the wire's classes.
"""

from __future__ import annotations

import logging
import random
from collections import Counter

from django.core.cache import cache

from webapp.worker import wire

log = logging.getLogger("roundtrip.gateway")
HEARTBEAT_SECONDS = 1.0
HEARTBEAT_TTL = 3  # seconds without a beat after which a worker counts as dead
_INDEX = "rt:workers"
_WORKER = "rt:worker:{}"
_LOAD = "rt:model-status:{}"

# Requests this web process has sent to each worker and not yet seen finish: beats are up to a
# second old, so a burst of requests would otherwise all go to the worker that looked idlest.
in_flight: Counter[str] = Counter()


def beat(status: wire.WorkerStatus) -> None:
    """Publish a worker's heartbeat (and make sure the index lists it)."""
    cache.set(_WORKER.format(status.worker), wire.encode(status), HEARTBEAT_TTL)
    ids: list[str] = cache.get(_INDEX) or []
    alive = [w for w in ids if w != status.worker and cache.get(_WORKER.format(w)) is not None]
    if alive + [status.worker] != ids:
        cache.set(_INDEX, alive + [status.worker], None)


def leave(worker: str) -> None:
    """A worker stopping cleanly says so, instead of letting its beat expire."""
    cache.delete(_WORKER.format(worker))


def is_alive(worker: str) -> bool:
    return cache.get(_WORKER.format(worker)) is not None


def live_workers(model_id: str | None = None) -> list[wire.WorkerStatus]:
    """Every worker whose beat is fresh (holding `model_id`, when given); a beat that does not parse is logged and
    left out, as if that worker were gone."""
    ids: list[str] = cache.get(_INDEX) or []
    workers = []
    for key, data in cache.get_many([_WORKER.format(w) for w in ids]).items():
        try:
            status = wire.decode(data, wire.WorkerStatus)
        except wire.WireError as exc:
            log.error("unreadable heartbeat %s: %s", key, exc)
            continue
        if model_id is None or model_id in status.models:
            workers.append(status)
    return workers


def pick(workers: list[wire.WorkerStatus], model_id: str) -> wire.WorkerStatus | None:
    """Of `workers` (from `live_workers`), the one with the most room for `model_id`, ties broken at random.

    Pure and quick, so an async caller can choose and count the request in `in_flight` with no await in
    between: a burst of requests then spreads instead of all seeing the same idle worker."""
    if not workers:
        return None

    def load(status: wire.WorkerStatus) -> float:
        slots = status.models[model_id]
        busy = max(slots.running + slots.waiting, in_flight[status.worker])
        return busy / max(1, slots.max_batch)

    best = min(load(w) for w in workers)
    return random.choice([w for w in workers if load(w) == best])


def publish_load(model_id: str, load: wire.ModelLoad) -> None:
    cache.set(_LOAD.format(model_id), wire.encode(load), None)


def model_load(model_id: str) -> wire.ModelLoad:
    """The latest load progress a worker published for `model_id`, and whether a live worker holds it."""
    data = cache.get(_LOAD.format(model_id))
    try:
        load = wire.ModelLoad(state="not started") if data is None else wire.decode(data, wire.ModelLoad)
    except wire.WireError as exc:
        log.error("unreadable load progress for %s: %s", model_id, exc)
        load = wire.ModelLoad(state="not started")
    if load.state == "ready" and not live_workers(model_id):
        detail = f"no inference worker holding {model_id} has reported in the last {HEARTBEAT_TTL} s"
        return wire.ModelLoad(state="unavailable", detail=detail)
    return load
