"""The one protocol between the web side and inference workers, over the Channels channel layer.

To a model's work channel (`inference.<model id>`):
    {"type": "generate", "request_id", "reply_to", "messages", "params", "level", "truncate_history", "step", "sent_at"}
    {"type": "tokenize", "request_id", "reply_to", "text"}
    {"type": "inspect", "request_id", "reply_to", "ids"}   full-level detail for the last of `ids`, recomputed
To the worker's own control channel (named in its "queued" reply):
    {"type": "cancel", "request_id"}
    {"type": "next", "request_id"}      step mode: the request pauses after each token until this arrives
Replies, on the requester's `reply_to` channel, in order:
    {"type": "queued", "request_id", "control"}                                 the worker has it; cancel goes to `control`
    {"type": "accepted", "request_id", "control", "prompt_tokens", "queued"}   the request passed every check
    {"type": "event", "request_id", "event": {...}}                              one trace event (inference.trace_json)
    {"type": "error", "request_id", "status", "message", "code", "param"}      before or instead of the end
    {"type": "cancelled", "request_id"}                                          the end of a cancelled request
    {"type": "tokens", "request_id", "ids", "tokens", "spans"}                 the answer to "tokenize"
    {"type": "inspection", "request_id", "detail"}                               the answer to "inspect"
A stream ends with the "finished" event, an "error" or "cancelled". `sent_at` is wall-clock seconds, so
the worker can tell how long the message waited in the channel, even across machines.
"""

from __future__ import annotations

from typing import Any

from inference.errors import ContextLengthExceededError, InvalidRequestError
from inference.sampling import SamplingParams

PARAM_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "max_tokens",
    "stop",
    "top_logprobs",
)


def params_to_dict(params: SamplingParams) -> dict[str, Any]:
    return {name: list(value) if name == "stop" else value for name in PARAM_FIELDS if (value := getattr(params, name)) is not None}


def params_from_dict(values: dict[str, Any]) -> SamplingParams:
    fields = {name: values[name] for name in PARAM_FIELDS if name in values}
    if "stop" in fields:
        fields["stop"] = tuple(fields["stop"])
    return SamplingParams(**fields)


def error_reply(request_id: str, exc: Exception) -> dict[str, Any]:
    """An inference-side failure as a reply the gateway turns into an OpenAI-style error."""
    if isinstance(exc, ContextLengthExceededError):
        return {"type": "error", "request_id": request_id, "status": 400, "message": str(exc), "code": "context_length_exceeded", "param": "messages"}
    if isinstance(exc, InvalidRequestError):
        return {"type": "error", "request_id": request_id, "status": 400, "message": str(exc), "code": "invalid_value", "param": exc.param}
    return {"type": "error", "request_id": request_id, "status": 500, "message": f"The model failed: {type(exc).__name__}: {exc}", "code": "server_error", "param": None}
