"""Parsing an OpenAI chat-completion request body, with errors that name the offending parameter."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from inference.params import MAX_TOP_LOGPROBS, SamplingParams
from webapp.gateway.errors import GatewayError, bad_request

KNOWN_FIELDS = {
    "model", "messages", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens",
    "max_completion_tokens", "stop", "seed", "n", "presence_penalty", "frequency_penalty", "logprobs",
    "top_logprobs", "stream", "stream_options", "user", "ignore_eos",
}
ROLES = ("system", "user", "assistant", "developer")


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, str]]
    params: SamplingParams
    max_tokens_given: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool  # stream_options.continuous_usage_stats (vLLM's): running usage in every chunk
    logprobs: bool
    user: str | None


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; 400 for non-UTF-8 bytes, invalid JSON or a non-object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"The request body is not valid UTF-8 (byte {exc.start}).") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}.") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"Invalid type for '{name}': expected a number, got {json.dumps(value)}.", name)
    if not low <= value <= high:
        raise bad_request(f"Invalid '{name}': {value} is out of range; expected a value from {low} to {high}.", name)
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"Invalid type for '{name}': expected an integer, got {json.dumps(value)}.", name)
    if not low <= value <= high:
        raise bad_request(f"Invalid '{name}': {value} is out of range; expected an integer from {low} to {high}.", name)
    return value


def _boolean(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"Invalid type for '{name}': expected a boolean, got {json.dumps(value)}.", name)
    return value


def _content(value: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts joined (the only part type a text model takes)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"Invalid '{where}[{i}]': only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported.", f"{where}[{i}]")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"Invalid type for '{where}': expected a string or a list of text parts, got {json.dumps(value)[:40]}.", where)


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise bad_request("'messages' must be a list of messages.", "messages")
    if not value:
        raise bad_request("'messages' must contain at least one message.", "messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise bad_request(f"Invalid 'messages[{i}]': expected an object with 'role' and 'content'.", f"messages[{i}]")
        role = message.get("role")
        if role not in ROLES:
            raise bad_request(
                f"Invalid value for 'messages[{i}].role': {json.dumps(role)}; supported roles are system, user and assistant.",
                f"messages[{i}].role",
            )
        if "content" not in message or message["content"] is None:
            raise bad_request(f"Missing required parameter: 'messages[{i}].content'.", f"messages[{i}].content")
        out.append({"role": "system" if role == "developer" else role, "content": _content(message["content"], f"messages[{i}].content")})
    return out


def parse_chat_request(body: dict[str, Any]) -> ChatRequest:
    """Validate every field; 400 GatewayError naming the first bad one."""
    unknown = sorted(set(body) - KNOWN_FIELDS)
    if unknown:
        raise bad_request(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("Missing required parameter: 'model'.", "model")
    messages = _messages(body.get("messages"))
    n = _integer(body, "n", 1, 128)
    if n not in (None, 1):
        raise bad_request("Only n=1 is supported.", "n")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop)):
        raise bad_request("Invalid 'stop': expected a non-empty string or a list of up to 4 non-empty strings.", "stop")
    logprobs = _boolean(body, "logprobs")
    top_logprobs = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top_logprobs and not logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
    max_tokens = _integer(body, "max_completion_tokens", 1, 1_000_000) or _integer(body, "max_tokens", 1, 1_000_000)
    seed = _integer(body, "seed", -(2**63), 2**64 - 1)
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}):
        raise bad_request("Invalid 'stream_options': only 'include_usage' and 'continuous_usage_stats' (true|false) are supported.", "stream_options")
    stream = _boolean(body, "stream")
    if options is not None and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true.", "stream_options")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request("Invalid type for 'user': expected a string.", "user")

    def given(value: float | None, default: float) -> float:
        return default if value is None else value

    params = SamplingParams(
        temperature=given(_number(body, "temperature", 0, 2), 1.0),
        top_p=given(_number(body, "top_p", 0, 1), 1.0),
        top_k=_integer(body, "top_k", 0, 1_000_000) or 0,
        min_p=given(_number(body, "min_p", 0, 1), 0.0),
        repetition_penalty=given(_number(body, "repetition_penalty", 0, 10), 1.0),
        presence_penalty=given(_number(body, "presence_penalty", -2, 2), 0.0),
        frequency_penalty=given(_number(body, "frequency_penalty", -2, 2), 0.0),
        seed=seed,
        max_tokens=max_tokens or settings.ROUNDTRIP_DEFAULT_MAX_TOKENS,
        stop=tuple(stop or ()),
        top_logprobs=top_logprobs or 0,
        ignore_eos=_boolean(body, "ignore_eos"),  # an extension (as in vLLM and llama.cpp): fixed output lengths for benchmarks
    )
    try:
        params.validate()
    except Exception as exc:  # InvalidRequestError: e.g. top_p 0
        raise GatewayError(400, str(exc), "invalid_request_error", "invalid_value", getattr(exc, "param", None)) from None
    return ChatRequest(
        model=model,
        messages=messages,
        params=params,
        max_tokens_given=max_tokens is not None,
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        continuous_usage=bool(options and options.get("continuous_usage_stats")),
        logprobs=logprobs,
        user=user,
    )
