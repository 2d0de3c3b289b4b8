"""Pages of the site. The chat page and the pipeline arrive with the visualizer; this is the front door."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from webapp.gateway.routing import configured_models
from webapp.worker.service import model_status


def home(request: HttpRequest) -> HttpResponse:
    return render(request, "home.html")


def health(request: HttpRequest) -> JsonResponse:
    """Whether each model is loaded (with its load progress), for load balancers and the page."""
    statuses = {route.id: model_status(route.id) for route in configured_models()}
    ready = all(s.get("state") == "ready" for s in statuses.values())
    return JsonResponse({"ready": ready, "models": statuses}, status=200 if ready else 503)
