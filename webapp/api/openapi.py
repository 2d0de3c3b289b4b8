"""The OpenAPI 3.1 description of the HTTP API, served at /v1/openapi.json."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from webapp.api.anthropic_protocol import CountTokensRequest, MessagesRequest
from webapp.api.openai_responses_protocol import ResponsesRequest
from webapp.api.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

ERROR = {"$ref": "#/components/schemas/Error"}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "Invalid request",
        401: "Missing, unknown, revoked or expired API key",
        403: "Model not allowed for this key",
        404: "Unknown model",
        405: "Wrong method",
        413: "Body too large",
        431: "Request headers too large",
        429: "Rate limit or budget exceeded (see Retry-After)",
        500: "The server failed (logged; the message carries the request id, never internal details)",
        503: "Overloaded or the worker is unavailable (see Retry-After)",
    }
    return {str(c): {"description": words[c], "content": {"application/json": {"schema": ERROR}}} for c in codes}


def _schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    """The model's JSON schema, its nested models moved into the document's components."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}


ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
GENERATION_ERRORS = (400, 401, 403, 404, 405, 413, 429, 431, 500, 503)
# OpenAPI 3.1 has a text/event-stream's `schema` describe each event (3.2 names that `itemSchema`): its `data` is a JSON
# chunk (or `[DONE]`, which ends an OpenAI stream), and `event` names it where the API does (Responses, Messages).
SSE_EVENT = {
    "type": "object",
    "properties": {
        "data": {"type": "string"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
    "required": ["data"],
}
STREAMED = {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": SSE_EVENT}}


def _post(
    summary: str, request: dict[str, Any], answer: str, errors: tuple[int, ...], streamed: bool = False
) -> dict[str, Any]:
    """A POST operation: its request body's schema, what a 200 holds, and the errors it may answer with."""
    ok: dict[str, Any] = {"description": answer, **({"content": STREAMED} if streamed else {})}
    body = {"required": True, "content": {"application/json": {"schema": request}}}
    return {"post": {"summary": summary, "requestBody": body, "responses": {"200": ok, **_errors(*errors)}}}


def openapi_spec(server_url: str) -> dict[str, Any]:
    """Generated from the request models in `webapp.api.protocol` (and `anthropic_protocol`): what validates a request
    is what this describes."""
    components: dict[str, Any] = {"Error": ERROR_SCHEMA}
    paths = {**_generation_paths(components), **_lookup_paths(components)}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Roundtrip API",
            "version": "1",
            "description": "OpenAI-compatible chat completions on a real model, with server-side timings.",
        },
        "servers": [{"url": server_url}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}, "schemas": components},
    }


def _generation_paths(components: dict[str, Any]) -> dict[str, Any]:
    """The endpoints that run the model."""
    return {
        "/chat/completions": _post(
            "Create a chat completion (stream with SSE when stream is true)",
            _schema(ChatCompletionRequest, components),
            "A chat.completion object, or text/event-stream of chat.completion.chunk objects ending with [DONE]",
            GENERATION_ERRORS,
            streamed=True,
        ),
        "/completions": _post(
            "Continue a raw text prompt (legacy completions, no chat template; SSE when stream is true)",
            _schema(CompletionRequest, components),
            "A text_completion object, or text/event-stream of text_completion chunks ending with [DONE]",
            GENERATION_ERRORS,
            streamed=True,
        ),
        "/responses": _post(
            "OpenAI's Responses API (function tools, text.format, previous_response_id; typed events when stream is "
            "true)",
            _schema(ResponsesRequest, components),
            "A response object, or text/event-stream of response.* events (response.created … response.completed)",
            GENERATION_ERRORS,
            streamed=True,
        ),
        "/messages": _post(
            "Anthropic's Messages API (the key as x-api-key or a bearer token; Anthropic's events when stream is true)",
            _schema(MessagesRequest, components),
            "A message object, or text/event-stream of Anthropic's events (message_start … message_stop)",
            GENERATION_ERRORS,
            streamed=True,
        ),
        "/messages/count_tokens": _post(
            "The prompt's tokens as the model reads them, in Anthropic's shape",
            _schema(CountTokensRequest, components),
            "input_tokens",
            (400, 401, 403, 404, 413, 431, 500, 503),
        ),
    }


def _lookup_paths(components: dict[str, Any]) -> dict[str, Any]:
    """The endpoints that only look things up: models, tokens."""
    return {
        "/models": {
            "get": {
                "summary": "List the models this key may use",
                "responses": {"200": {"description": "A list of models"}, **_errors(401, 500)},
            }
        },
        "/models/{model}": {
            "get": {
                "summary": "One model, by its id or an alias",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "The model"}, **_errors(401, 404, 500)},
            }
        },
        "/responses/{response_id}": {
            operation: {
                "summary": summary,
                "parameters": [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": answer}, **_errors(401, 404, 500)},
            }
            for operation, summary, answer in (
                ("get", "A stored response (this key's), as it was returned", "The response object"),
                ("delete", "Forget a stored response", "{id, object: response.deleted, deleted: true}"),
            )
        },
        "/tokenize": _post(
            "Token ids and token strings for a text",
            _schema(TokenizeRequest, components),
            "ids, tokens, spans and count (and for messages the rendered prompt and its segments)",
            (400, 401, 403, 404, 413, 431, 500, 503),
        ),
        "/detokenize": _post(
            "The text that token ids spell",
            _schema(DetokenizeRequest, components),
            "text",
            (400, 401, 403, 404, 413, 431, 500, 503),
        ),
    }
