"""The gateway's own counters, kept by observing every turn's settlement (see `webapp.gateway.lifecycle`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from webapp.metrics import metrics
from webapp.worker import wire

if TYPE_CHECKING:
    from webapp.gateway.lifecycle import Turn
    from webapp.usage.models import UsageRecord


class GatewayMetrics:
    async def starting(self, turn: Turn) -> None:
        pass

    async def started(self, turn: Turn) -> None:
        pass

    async def event(self, turn: Turn, index: int, event: wire.TraceEvent) -> None:
        pass

    async def settled(self, turn: Turn, record: UsageRecord) -> None:
        metrics.labelled(metrics.gateway_requests, record.endpoint, str(record.status)).inc()
        if record.status >= 400:
            metrics.labelled(metrics.gateway_refused, record.endpoint, record.error_code or str(record.status)).inc()
