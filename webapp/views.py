"""Site-wide endpoints that belong to no app: the health check, and the error pages (JSON in OpenAI's shape under
/v1/, a short HTML page elsewhere; never a traceback)."""

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from webapp.catalog import configured_models
from webapp.gateway.errors import GatewayError
from webapp.gateway.model_status import model_status, refresh
from webapp.worker import registry, wire


async def health(request: HttpRequest) -> JsonResponse:
    """Whether each model is ready: a local one loaded and held by a live worker (with load progress), an upstream
    one with a server in rotation (each server's state); and which workers are alive. The answer is 200 once every
    local model is ready: an upstream server that is down is another machine's state, shown but not this one's (its
    model may still answer through a fallback)."""
    await refresh()
    statuses = {route.id: await model_status(route) for route in configured_models()}
    ready = all(statuses[route.id]["state"] == "ready" for route in configured_models() if not route.upstream)
    live = await sync_to_async(registry.live_workers)()
    workers = [{"worker": w.worker, "host": w.host, "pid": w.pid, "models": w.models} for w in live]
    body = wire.plain({"ready": ready, "models": statuses, "workers": workers})
    return JsonResponse(body, status=200 if ready else 503)


def _error(request: HttpRequest, status: int, message: str, kind: str, code: str) -> HttpResponse:
    if request.path.startswith("/v1/"):
        return JsonResponse(GatewayError(status, message, kind, code).body(), status=status)
    return render(request, "error.html", {"status": status, "message": message}, status=status)


def not_found(request: HttpRequest, exception: Any = None) -> HttpResponse:
    return _error(request, 404, f"There is nothing at {request.path}.", "invalid_request_error", "not_found")


def server_error(request: HttpRequest) -> HttpResponse:
    return _error(
        request,
        500,
        "The server failed while handling this request; it has been logged.",
        "server_error",
        "server_error",
    )
