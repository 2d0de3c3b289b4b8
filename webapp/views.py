"""Site-wide endpoints that belong to no app: the health check."""

from django.http import HttpRequest, JsonResponse

from webapp.gateway.routing import configured_models
from webapp.worker import registry


def health(request: HttpRequest) -> JsonResponse:
    """Whether each model is loaded and held by a live worker (with load progress), and which workers are alive."""
    statuses = {route.id: registry.model_load(route.id) for route in configured_models()}
    ready = all(s.get("state") == "ready" for s in statuses.values())
    workers = [{"worker": w["worker"], "host": w["host"], "pid": w["pid"], "models": w["models"]} for w in registry.live_workers()]
    return JsonResponse({"ready": ready, "models": statuses, "workers": workers}, status=200 if ready else 503)
