"""Schemathesis against the served OpenAPI document, with a key, on a live server (the tiny model): every operation,
bounded in examples. No 5xx; every status code and content type is one the document declares; every response fits
its declared schema. The document is generated from the request models, so this also checks the models against the
server that enforces them."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from webapp.api.openapi import openapi_spec

pytestmark = pytest.mark.django_db(transaction=True)
schema = schemathesis.openapi.from_dict(openapi_spec("http://127.0.0.1/v1"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_key(daphne_server: Any, django_db_blocker: Any) -> str:
    from webapp.keys.models import ApiKey

    with django_db_blocker.unblock():
        _, raw = ApiKey.create_key("fuzz", requests_per_minute=0, tokens_per_minute=0, concurrent_streams=0)
    return raw


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_the_api_conforms_to_its_document(case: Any, daphne_server: Any, fuzz_key: str) -> None:
    if isinstance(case.body, dict):
        if zlib.crc32(json.dumps(case.body, sort_keys=True, default=str).encode()) % 4:
            case.body["model"] = "tiny"  # three cases in four reach the model instead of stopping at routing
        if "max_tokens" not in case.body and case.path.endswith("completions"):
            case.body["max_tokens"] = 4  # keep generations short: the point is the answers' shape, not their length
    case.call_and_validate(
        base_url=daphne_server.api, headers={"Authorization": f"Bearer {fuzz_key}"}, checks=CHECKS, timeout=60
    )
