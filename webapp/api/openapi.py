"""The OpenAPI 3.1 description of the HTTP API, served at /v1/openapi.json."""

from __future__ import annotations

from typing import Any

from inference.params import MAX_TOP_LOGPROBS

ERROR = {"$ref": "#/components/schemas/Error"}


def _errors(*codes: int) -> dict[str, Any]:
    words = {400: "Invalid request", 401: "Missing, unknown, revoked or expired API key", 403: "Model not allowed for this key",
             404: "Unknown model", 405: "Wrong method", 413: "Body too large", 429: "Rate limit or budget exceeded (see Retry-After)",
             503: "Overloaded or the worker is unavailable (see Retry-After)"}
    return {str(c): {"description": words[c], "content": {"application/json": {"schema": ERROR}}} for c in codes}


def openapi_spec(server_url: str) -> dict[str, Any]:
    number = {"type": "number"}
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"enum": ["system", "developer", "user", "assistant"]},
            "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object", "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]},
        },
    }
    chat_request = {
        "type": "object",
        "additionalProperties": False,
        "required": ["model", "messages"],
        "properties": {
            "model": {"type": "string"},
            "messages": {"type": "array", "minItems": 1, "items": message},
            "temperature": number | {"minimum": 0, "maximum": 2, "default": 1},
            "top_p": number | {"exclusiveMinimum": 0, "maximum": 1, "default": 1},
            "top_k": {"type": "integer", "minimum": 0, "default": 0},
            "min_p": number | {"minimum": 0, "maximum": 1, "default": 0},
            "repetition_penalty": number | {"exclusiveMinimum": 0, "maximum": 10, "default": 1},
            "presence_penalty": number | {"minimum": -2, "maximum": 2, "default": 0},
            "frequency_penalty": number | {"minimum": -2, "maximum": 2, "default": 0},
            "max_tokens": {"type": "integer", "minimum": 1},
            "max_completion_tokens": {"type": "integer", "minimum": 1},
            "stop": {"oneOf": [{"type": "string"}, {"type": "array", "maxItems": 4, "items": {"type": "string"}}]},
            "seed": {"type": "integer"},
            "n": {"const": 1},
            "logprobs": {"type": "boolean"},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
            "stream": {"type": "boolean"},
            "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}, "continuous_usage_stats": {"type": "boolean"}}},
            "user": {"type": "string"},
            "ignore_eos": {"type": "boolean", "default": False, "description": "Keep generating past end-of-turn tokens (fixed output lengths for benchmarks)."},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Roundtrip API", "version": "1", "description": "OpenAI-compatible chat completions on a real model, with server-side timings."},
        "servers": [{"url": server_url}],
        "security": [{"bearer": []}],
        "paths": {
            "/chat/completions": {
                "post": {
                    "summary": "Create a chat completion (stream with SSE when stream is true)",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": chat_request}}},
                    "responses": {
                        "200": {
                            "description": "A chat.completion object, or text/event-stream of chat.completion.chunk objects ending with [DONE]",
                            "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": {"type": "string"}}},
                        },
                        **_errors(400, 401, 403, 404, 405, 413, 429, 503),
                    },
                }
            },
            "/models": {"get": {"summary": "List the models this key may use", "responses": {"200": {"description": "A list of models"}, **_errors(401)}}},
            "/tokenize": {
                "post": {
                    "summary": "Token ids and token strings for a text",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["model", "text"], "additionalProperties": False,
                        "properties": {"model": {"type": "string"}, "text": {"type": "string"}}}}}},
                    "responses": {"200": {"description": "ids, tokens, spans and count"}, **_errors(400, 401, 403, 404, 413)},
                }
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {"error": {"type": "object", "properties": {
                        "message": {"type": "string"}, "type": {"type": "string"},
                        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
                }
            },
        },
    }
