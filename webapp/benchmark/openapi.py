"""The OpenAPI 3.1 description of the benchmark page's endpoints, served at /bench/openapi.json: generated from the
models that check a saved result (`webapp.benchmark.saved`), so what is checked is what this describes."""

from __future__ import annotations

from typing import Any

from webapp.api.openapi import ERROR_SCHEMA
from webapp.benchmark.saved import Result

HTML = {"text/html": {"schema": {"type": "string"}}}
JSON_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
SLUG = [{"name": "slug", "in": "path", "required": True, "schema": {"type": "string"}}]


def bench_spec(server_url: str) -> dict[str, Any]:
    components: dict[str, Any] = {"Error": ERROR_SCHEMA}
    result = Result.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(result.pop("$defs", {}))
    components["Result"] = result
    paths = {"/results/new": _save(), "/r/{slug}.json": _export("application/json", "The result, as JSON")}
    paths["/r/{slug}.csv"] = _export("text/csv", "One row per request (text that would run as a formula is escaped)")
    paths["/r/{slug}/"] = _page("A kept result's read-only page", SLUG)
    slugs = {"type": "array", "items": {"type": "string"}}
    compared = [{"name": "r", "in": "query", "required": False, "schema": slugs}]
    paths["/compare"] = _page("Up to six kept results in one table and one set of charts (?r=SLUG&r=SLUG)", compared)
    paths["/state"] = {
        "get": {
            "summary": "The engines' batch and queue now, from the workers' heartbeats",
            "responses": {
                "200": {
                    "description": "Per model: running, waiting, KV cache use",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Roundtrip benchmark page", "version": "1"},
        "servers": [{"url": server_url}],
        "paths": paths,
        "components": {"schemas": components},
    }


def _save() -> dict[str, Any]:
    kept = {
        "type": "object",
        "properties": {"slug": {"type": "string"}, "url": {"type": "string"}},
        "required": ["slug", "url"],
    }
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/Result"}}}
    return {
        "post": {
            "summary": "Keep a finished run (this browser's session, with its CSRF token)",
            "requestBody": {"required": True, "content": body},
            "responses": {
                "201": {"description": "Kept: its read-only link", "content": {"application/json": {"schema": kept}}},
                "400": {"description": "Not a result this page keeps (the field named)", "content": JSON_ERROR},
                "403": {"description": "No session or CSRF token", "content": HTML},
                "413": {
                    "description": "Larger than the upload limit (ROUNDTRIP_MAX_BODY_BYTES, 1 MiB)",
                    "content": JSON_ERROR,
                },
            },
        }
    }


def _page(what: str, parameters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "get": {
            "summary": what,
            "parameters": parameters,
            "responses": {
                "200": {"description": what, "content": HTML},
                "404": {"description": "No result with these links", "content": HTML},
            },
        }
    }


def _export(content_type: str, what: str) -> dict[str, Any]:
    return {
        "get": {
            "summary": f"A kept result: {what}",
            "parameters": SLUG,
            "responses": {
                "200": {
                    "description": what,
                    "content": {
                        content_type: {"schema": {"type": "string" if content_type == "text/csv" else "object"}}
                    },
                },
                "404": {"description": "No result with this link", "content": HTML},
            },
        }
    }
