"""Site-wide endpoints that belong to no app: the health check."""

from django.http import HttpRequest, JsonResponse

from webapp.gateway.routing import configured_models
from webapp.worker.service import model_status


def health(request: HttpRequest) -> JsonResponse:
    """Whether each model is loaded (with its load progress), for load balancers and the page."""
    statuses = {route.id: model_status(route.id) for route in configured_models()}
    ready = all(s.get("state") == "ready" for s in statuses.values())
    return JsonResponse({"ready": ready, "models": statuses}, status=200 if ready else 503)
