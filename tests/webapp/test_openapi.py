"""The served OpenAPI document is generated from the request models, and the example requests in docs/api.md fit it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from webapp.api.openapi import openapi_spec
from webapp.api.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
EXAMPLE = re.compile(r"```http\nPOST /v1(\S+)\n(.*?)\n```", re.S)


def _request_validator(spec: dict[str, Any], path: str) -> Draft202012Validator:
    ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return Draft202012Validator({**ref, "components": spec["components"]})


def test_the_document_is_the_request_models_schemas() -> None:
    spec = openapi_spec("http://testserver/v1")
    for model in (ChatCompletionRequest, CompletionRequest, TokenizeRequest, DetokenizeRequest):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schema.pop("$defs", None)
        assert spec["components"]["schemas"][model.__name__] == schema
    Draft202012Validator.check_schema(spec["components"]["schemas"]["ChatCompletionRequest"])


def _examples() -> list[tuple[str, dict[str, Any]]]:
    return [(path, json.loads(body)) for path, body in EXAMPLE.findall(API_DOC.read_text())]


def test_the_readme_has_examples_for_every_post_endpoint() -> None:
    assert {path for path, _ in _examples()} == {
        "/chat/completions",
        "/completions",
        "/responses",
        "/messages",
        "/tokenize",
        "/detokenize",
    }


@pytest.mark.parametrize(("path", "body"), _examples(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_readme_example_request_validates_against_the_document(path: str, body: dict[str, Any]) -> None:
    spec = openapi_spec("http://testserver/v1")
    errors = [e.message for e in _request_validator(spec, path).iter_errors(body)]
    assert errors == []


def test_the_document_rejects_what_the_models_reject() -> None:
    spec = openapi_spec("http://testserver/v1")
    validator = _request_validator(spec, "/chat/completions")
    assert not validator.is_valid({"model": "smollm2", "messages": [{"role": "wizard", "content": "x"}]})
    assert not validator.is_valid({"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "n": 99})
