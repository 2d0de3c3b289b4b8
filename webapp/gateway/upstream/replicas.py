"""Each upstream server's state in this web process, and the choice of the server a request tries next.

A server is picked among its model's replicas by the fewest requests in flight; one that failed (refused, timed out,
answered 5xx or 429, broke mid-stream, or missed a probe) is left out for `ROUNDTRIP_UPSTREAM_COOLDOWN` seconds (or
its Retry-After) unless nothing else is left; a success or a probe that answers brings it back. When every replica has
been tried, the model's fallbacks are, in order. State is per web process: each web process learns on its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from webapp.catalog import ModelRoute, Upstream, by_name


@dataclass
class ReplicaState:
    in_flight: int = 0
    down_until: float = 0.0  # monotonic seconds; 0: up
    failures: int = 0  # in a row
    last_error: str = ""
    last_probe: float | None = None  # monotonic seconds of the last probe's answer or failure
    served: int = 0
    failed: int = 0
    retried: int = 0
    probe_ms: float | None = None

    @property
    def up(self) -> bool:
        return time.monotonic() >= self.down_until


_states: dict[str, ReplicaState] = {}


def state(upstream: Upstream) -> ReplicaState:
    return _states.setdefault(upstream.name, ReplicaState())


def failed(upstream: Upstream, why: str, retry_after: float | None = None) -> None:
    """A request or probe failed: leave the server out for the cooldown (or as long as it asked)."""
    s = state(upstream)
    s.failures += 1
    s.failed += 1
    s.last_error = why
    cooldown = settings.ROUNDTRIP_UPSTREAM_COOLDOWN if retry_after is None else min(retry_after, 300.0)
    s.down_until = time.monotonic() + cooldown


def succeeded(upstream: Upstream) -> None:
    s = state(upstream)
    s.failures, s.down_until = 0, 0.0


@dataclass
class Attempts:
    """The servers one request has tried, in order, and why each failed: the page's routing decision."""

    route: ModelRoute
    tried: list[dict[str, Any]] = field(default_factory=list)

    def next(self) -> tuple[ModelRoute, Upstream] | None:
        """The next server to try: the fewest in flight among the first model (this route, then each fallback)
        with an untried replica, up ones before down ones; None when every one was tried or the attempts are
        spent."""
        if len(self.tried) >= settings.ROUNDTRIP_UPSTREAM_ATTEMPTS:
            return None
        names = {t["upstream"] for t in self.tried}
        for route in self._models():
            left = [r for r in route.replicas if r.name not in names]
            if left:
                best = min(left, key=lambda r: (not state(r).up, state(r).in_flight, state(r).down_until))
                return route, best
        return None

    def _models(self) -> list[ModelRoute]:
        routes, seen, order = [], set(), [self.route.id, *self.route.fallback]
        names = by_name()
        while order:
            model_id = order.pop(0)
            route = names.get(model_id)
            if route is None or model_id in seen or not route.upstream:
                continue
            seen.add(model_id)
            routes.append(route)
            order += list(route.fallback)
        return routes

    def failed(self, route: ModelRoute, upstream: Upstream, why: str, status: int | None = None) -> None:
        self.tried.append({"model": route.id, "upstream": upstream.name, "error": why, "status": status})
        state(upstream).retried += 1


def report(route: ModelRoute) -> dict[str, Any]:
    """An upstream model's state for /health and /v1/models: "ready" while any replica is up."""
    servers = []
    for upstream in route.replicas:
        s = state(upstream)
        servers.append(
            {
                "name": upstream.name,
                "url": upstream.url,
                "model": upstream.model,
                "state": "up" if s.up else "down",
                "in_flight": s.in_flight,
                "down_for_s": round(max(0.0, s.down_until - time.monotonic()), 1),
                "last_error": s.last_error,
                "probe_ms": s.probe_ms,
                "served": s.served,
                "failed": s.failed,
            }
        )
    up = any(server["state"] == "up" for server in servers)
    return {"state": "ready" if up else "unavailable", "upstream": servers, "fallback": list(route.fallback)}
