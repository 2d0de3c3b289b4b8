"""The benchmark page: measure in the browser, keep results, list them, share a read-only link, export them.

The page itself streams from `/v1/chat/completions` (with this browser's session or a key the user
pastes) and times every chunk with `performance.now()`; these views only keep and show what it measured.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from webapp.benchmark import saved
from webapp.benchmark.models import CSV_FIELDS, BenchResult
from webapp.benchmark.openapi import bench_spec
from webapp.catalog import configured_models
from webapp.gateway.errors import GatewayError
from webapp.gateway.json_input import BadJSON, loads_object
from webapp.worker import registry

PRESETS = {
    "capital": "What's the capital of India?",
    "story": "Tell me a long story about a lighthouse keeper.",
    "code": "Write a Python function that checks whether a number is prime, with comments.",
}


def _owner(request: HttpRequest) -> tuple[int | None, str]:
    if not request.session.session_key:
        request.session.save()
    return (request.user.pk if request.user.is_authenticated else None), request.session.session_key or ""


@require_GET
def page(request: HttpRequest) -> HttpResponse:
    _owner(request)
    models = [r.id for r in configured_models()]
    return render(
        request, "benchmark/bench.html", {"models": models, "presets": PRESETS, "presets_json": json.dumps(PRESETS)}
    )


def _refused(status: int, message: str, param: str | None = None) -> JsonResponse:
    error = GatewayError(status, message, "invalid_request_error", "invalid_result", param)
    return JsonResponse(error.body(), status=status)


@require_POST
def save(request: HttpRequest) -> JsonResponse:
    """Keep a finished run: {"title", "settings", "lanes"} → its permalink. Read as the API reads a body, then checked
    field by field (`webapp.benchmark.saved`): what is kept is what the page and the exports can show."""
    try:
        body = request.body  # past DATA_UPLOAD_MAX_MEMORY_SIZE Django refuses to read it
    except RequestDataTooBig:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return _refused(413, f"This result is too large to keep: at most {limit} bytes.")
    try:
        text = body.decode("utf-8")
        result = saved.validate(loads_object(text, "The result"))
    except UnicodeDecodeError:
        return _refused(400, "The result is not valid UTF-8.")
    except BadJSON as exc:
        return _refused(400, exc.message, exc.param)
    except ValueError as exc:
        return _refused(400, f"This result cannot be kept: {exc}")
    user_id, session_key = _owner(request)
    kept = result.model_dump()
    result = BenchResult.objects.create(
        user_id=user_id,
        session_key=session_key,
        title=kept["title"] or "benchmark",
        settings=kept["settings"],
        lanes=kept["lanes"],
    )
    return JsonResponse(
        {"slug": result.slug, "url": request.build_absolute_uri(f"/bench/r/{result.slug}/")},
        status=201,
        headers={"HX-Trigger": "bench-saved"},
    )


@require_GET
def result_list(request: HttpRequest) -> HttpResponse:
    return render(request, "benchmark/_results.html", {"results": BenchResult.owned_by(*_owner(request))[:50]})


def _result(slug: str) -> BenchResult:
    result = BenchResult.objects.filter(slug=slug).first()
    if result is None:
        raise Http404("No benchmark result with this link.")
    return result


@require_GET
def permalink(request: HttpRequest, slug: str) -> HttpResponse:
    """Anyone with the link sees the result, read-only (the page draws it from the same data it measured)."""
    result = _result(slug)
    data = {
        "title": result.title,
        "settings": result.settings,
        "lanes": saved.lanes_of(result.lanes),
        "created": result.created_at.isoformat(),
        "slug": result.slug,
    }
    return render(request, "benchmark/result.html", {"result": result, "result_json": data})


@require_GET
def compare(request: HttpRequest) -> HttpResponse:
    """Several saved results in one table and one set of charts: `?r=SLUG&r=SLUG` (links, so read-only too)."""
    slugs = request.GET.getlist("r")[:6]
    results = [r for r in (BenchResult.objects.filter(slug=s).first() for s in slugs) if r is not None]
    if not results:
        raise Http404("Choose saved results to compare.")
    lanes = [{**lane, "name": f"{r.title[:30]} · {lane['name']}"} for r in results for lane in saved.lanes_of(r.lanes)]
    data = {
        "title": " vs ".join(r.title[:30] for r in results),
        "lanes": lanes,
        "slug": "-".join(r.slug for r in results),
    }
    return render(request, "benchmark/compare.html", {"results": results, "result_json": data})


@require_GET
def export_json(request: HttpRequest, slug: str) -> JsonResponse:
    result = _result(slug)
    return JsonResponse(
        {
            "title": result.title,
            "created": result.created_at.isoformat(),
            "settings": result.settings,
            "lanes": saved.lanes_of(result.lanes),
        },
        headers={"Content-Disposition": f'attachment; filename="bench-{slug}.json"'},
    )


@require_GET
def export_csv(request: HttpRequest, slug: str) -> HttpResponse:
    result = _result(slug)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=["lane", "run", *CSV_FIELDS])
    writer.writeheader()
    writer.writerows(result.rows())
    return HttpResponse(
        out.getvalue(),
        content_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="bench-{slug}.csv"'},
    )


@require_GET
def scheduler_state(request: HttpRequest) -> JsonResponse:
    """The engines' batch right now (from the workers' heartbeats, at most a second old), for the load chart."""
    models: dict[str, dict[str, Any]] = {}
    for worker in registry.live_workers():
        for model_id, slots in worker.models.items():
            m = models.setdefault(model_id, {"running": 0, "waiting": 0, "kv_usage": 0.0})
            m["running"] += slots.running
            m["waiting"] += slots.waiting
            m["kv_usage"] = max(m["kv_usage"], slots.kv_usage)
    return JsonResponse({"models": models})


@require_GET
def openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(bench_spec(request.build_absolute_uri("/bench")))
