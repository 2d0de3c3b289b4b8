"""`GET /metrics`: this process's Prometheus metrics (its gateway counters, and the engine's when the worker runs
here)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from webapp.gateway.errors import GatewayError
from webapp.metrics import metrics
from webapp.metrics.access import allowed
from webapp.worker import registry


def metrics_view(request: HttpRequest) -> HttpResponse:
    headers = {name.lower(): value for name, value in request.headers.items()}
    if not allowed(
        request.headers.get("Authorization"),
        request.META.get("REMOTE_ADDR"),
        settings.ROUNDTRIP_METRICS_TOKEN,
        headers,
        settings.ROUNDTRIP_TRUSTED_PROXIES,
    ):
        why = (
            "a valid bearer token"
            if settings.ROUNDTRIP_METRICS_TOKEN
            else "a loopback address (set ROUNDTRIP_METRICS_TOKEN to allow others)"
        )
        refused = GatewayError(403, f"Metrics need {why}.", "invalid_request_error", "forbidden")
        return JsonResponse(refused.body(), status=refused.status)
    metrics.workers_alive.set(len(registry.live_workers()))
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
