"""Schemathesis against the served OpenAPI document, with a key, on a live server (the tiny model): every operation,
bounded in examples. No 5xx; every status code and content type is one the document declares; every response fits
its declared schema. The document is generated from the request models, so this also checks the models against the
server that enforces them."""

from __future__ import annotations

import json
import time
import zlib
from typing import Any

import httpx2 as httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from webapp.api.openapi import openapi_spec
from webapp.benchmark.openapi import bench_spec
from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)
schema = schemathesis.openapi.from_dict(openapi_spec("http://127.0.0.1/v1"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_key(site_server: Any, django_db_blocker: Any) -> str:
    from webapp.keys.models import ApiKey

    with django_db_blocker.unblock():
        _, raw = ApiKey.create_key("fuzz", requests_per_minute=0, tokens_per_minute=0, concurrent_streams=0)
    return raw


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_the_api_conforms_to_its_document(case: Any, site_server: Any, fuzz_key: str) -> None:
    if isinstance(case.body, dict):
        if zlib.crc32(json.dumps(case.body, sort_keys=True, default=str).encode()) % 4:
            case.body["model"] = "tiny"  # three cases in four reach the model instead of stopping at routing
        if "max_tokens" not in case.body and case.path.endswith("completions"):
            case.body["max_tokens"] = 4  # keep generations short: the point is the answers' shape, not their length
        if "max_output_tokens" not in case.body and case.path.endswith("responses"):
            case.body["max_output_tokens"] = 4
    case.call_and_validate(
        base_url=site_server.api, headers={"Authorization": f"Bearer {fuzz_key}"}, checks=CHECKS, timeout=60
    )


STREAMS = {
    "/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "/completions": {"prompt": "hi", "max_tokens": 4},
    "/responses": {"input": "hi", "max_output_tokens": 4},
    "/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
}


@pytest.mark.parametrize("path", sorted(STREAMS))
def test_a_streamed_answer_conforms_to_its_document(path: str, site_server: Any) -> None:
    """Each event of a stream, as the document describes an event (the fuzzing above reaches a stream only now and
    then: most generated bodies are refused first). The key is this test's own: the database is emptied after each
    test."""
    from webapp.keys.models import ApiKey

    _, key = ApiKey.create_key("stream", requests_per_minute=0, tokens_per_minute=0, concurrent_streams=0)
    case = schema[path]["POST"].Case(body={"model": "tiny", "stream": True, **STREAMS[path]})
    response = case.call(base_url=site_server.api, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert response.status_code == 200 and response.headers["content-type"][0].startswith("text/event-stream")
    case.validate_response(response, checks=CHECKS)


def numeric_fields() -> list[tuple[str, str, dict[str, Any]]]:
    """(path, field, its number schema) for every numeric field of every POST body in the served document."""
    spec = openapi_spec("http://127.0.0.1/v1")
    components = spec["components"]["schemas"]
    found = []
    for path, operations in spec["paths"].items():
        ref = operations.get("post", {}).get("requestBody", {}).get("content", {}).get("application/json", {})
        name = ref.get("schema", {}).get("$ref", "").rsplit("/", 1)[-1]
        for field, schema in components.get(name, {}).get("properties", {}).items():
            for option in schema.get("anyOf", [schema]):
                numbers = option.get("type") in ("integer", "number") or "patternProperties" in option
                ids = option.get("type") == "array" and option.get("items", {}).get("type") == "integer"
                if numbers or ids:
                    found.append((path, field, option))
    return found


NUMERIC_FIELDS = numeric_fields()
BASES = {
    "/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/completions": {"prompt": "hi"},
    "/tokenize": {"text": "hi"},
    "/detokenize": {"tokens": [1, 2]},
}


@st.composite
def out_of_range(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A valid body for one endpoint with one numeric or token-id field out of its range (or of the vocabulary)."""
    path, field, schema = draw(st.sampled_from(NUMERIC_FIELDS))
    beyond = st.integers(min_value=300, max_value=10**9 - 1)  # well-formed token ids, beyond any vocabulary here
    if "patternProperties" in schema:  # token id -> bias: an id beyond the vocabulary, or a bias beyond +-100
        bias = st.one_of(st.floats(-100, 100), st.floats(min_value=100.5, max_value=1e30), st.floats(-1e30, -100.5))
        value: Any = {str(draw(beyond)): draw(bias)}
    elif schema.get("type") == "array":  # a list of token ids with one beyond the vocabulary, or negative
        value = [1, draw(st.one_of(beyond, st.integers(max_value=-1))), 2]
    else:
        low, high = schema.get("minimum", schema.get("exclusiveMinimum")), schema.get("maximum")
        below = st.integers(max_value=int(low) - 1) if low is not None else st.nothing()
        above = st.integers(min_value=int(high) + 1) if high is not None else st.nothing()
        value = draw(st.one_of(below, above, st.sampled_from([low, high]).filter(lambda v: v is not None)))
        if schema["type"] == "number" and draw(st.booleans()):
            value = float(value) * draw(st.sampled_from([1.0, 1.5, 1e30]))
    return path, {"model": "tiny", "max_tokens": 4, **BASES.get(path, {}), field: value}


@given(case=out_of_range())
@settings(max_examples=90, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_out_of_range_numbers_and_ids_are_fast_4xx_with_one_usage_row(
    case: tuple[str, dict[str, Any]], site_server: Any, fuzz_key: str
) -> None:
    path, body = case
    if path not in ("/chat/completions", "/completions"):
        body.pop("max_tokens", None)
    started = time.monotonic()
    reply = httpx.post(
        f"{site_server.api}{path}", json=body, headers={"Authorization": f"Bearer {fuzz_key}"}, timeout=60
    )
    took = time.monotonic() - started
    assert reply.status_code < 500 and took < 2.0, (path, body, reply.status_code, took, reply.text[:300])
    request_id = reply.headers["x-request-id"]
    deadline = time.monotonic() + 5
    while not UsageRecord.objects.filter(request_id=request_id).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert UsageRecord.objects.filter(request_id=request_id).count() == 1


bench_schema = schemathesis.openapi.from_dict(bench_spec("http://127.0.0.1/bench"))


@pytest.fixture(scope="module")
def page_session(site_server: Any) -> dict[str, str]:
    """A browser's session on the benchmark page: its cookies and CSRF token, as the page's own requests carry them."""
    page = httpx.get(f"{site_server.url}/bench/", timeout=30)
    cookies = "; ".join(f"{name}={value}" for name, value in page.cookies.items())
    return {"Cookie": cookies, "X-CSRFToken": page.cookies["csrftoken"]}


@bench_schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_the_benchmark_pages_endpoints_conform_to_their_document(
    case: Any, site_server: Any, page_session: dict[str, str]
) -> None:
    case.call_and_validate(base_url=f"{site_server.url}/bench", headers=page_session, checks=CHECKS, timeout=60)
