"""The OpenAI-compatible HTTP API: thin async views over the gateway's `Turn` (authenticate → limit → route →
generate → settle → usage row); they parse, call and translate into JSON and SSE. Every request leaves one usage
row, whether it succeeded, failed or its client left.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel

from webapp.api import anthropic_responses, openai_responses_output, stored_responses
from webapp.api.anthropic_protocol import CountTokensRequest, MessagesRequest
from webapp.api.completions import (
    choices_for,
    completion,
    text_completion,
)
from webapp.api.openai_responses_output import ResponseWriter
from webapp.api.openai_responses_protocol import ResponsesRequest
from webapp.api.openapi import openapi_spec
from webapp.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    json_body,
    parse,
)
from webapp.api.responses import chat_stream, complete, error_response, text_stream
from webapp.catalog import ModelRoute, configured_models
from webapp.gateway import client
from webapp.gateway.client_ip import client_ip
from webapp.gateway.errors import GatewayError
from webapp.gateway.gateway import RequestContext, route_model
from webapp.gateway.identity import Identity, identify_key, identify_session, known_key
from webapp.gateway.lifecycle import Turn
from webapp.gateway.model_status import model_status, refresh
from webapp.gateway.routing import resolve, unknown_model
from webapp.transport import APP_HEADER_BYTES
from webapp.worker import wire

Request = TypeVar("Request", bound=BaseModel)


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        raw = request.body
    except RequestDataTooBig:
        raise GatewayError(
            413, "The request body is too large.", "invalid_request_error", "request_too_large"
        ) from None
    return json_body(raw)


def _parsed(turn: Turn, request: HttpRequest, model: type[Request]) -> Request:
    """The body validated as `model` (a 400 naming the field otherwise); the JSON as it came stays on the turn for
    its observers (the staff watch page shows it)."""
    raw = _body(request)
    turn.ctx.request_body = raw
    parsed: Request = parse(model, raw)
    return parsed


def _headers_too_large(request: HttpRequest) -> GatewayError | None:
    scope = getattr(request, "scope", None)  # an ASGI request's headers as they came: no header mapping to build
    if scope is not None:
        size = sum(len(name) + len(value) for name, value in scope["headers"])
    else:
        size = sum(len(name) + len(value) for name, value in request.headers.items())
    if size <= APP_HEADER_BYTES:
        return None
    return GatewayError(
        431,
        f"The request's headers take {size:,} bytes; the limit is {APP_HEADER_BYTES:,}.",
        "invalid_request_error",
        "headers_too_large",
    )


def _method_not_allowed(request: HttpRequest, allowed: str) -> GatewayError:
    return GatewayError(
        405,
        f"Method {request.method} is not allowed here; use {allowed}.",
        "invalid_request_error",
        "method_not_allowed",
        headers={"Allow": allowed},
    )


ApiView = Callable[..., Awaitable[HttpResponse]]  # (request, turn, **the URL's arguments)


def api_view(method: str, endpoint: str) -> Callable[[ApiView], Callable[[HttpRequest], Awaitable[HttpResponse]]]:
    """An API endpoint: its methods ("GET" or "GET, DELETE"; 405 in OpenAI's shape otherwise), no CSRF (keys, not
    cookies), a gateway Turn."""

    def wrap(view: ApiView) -> Callable[[HttpRequest], Awaitable[HttpResponse]]:
        @csrf_exempt
        @functools.wraps(view)
        async def endpoint_view(request: HttpRequest, **arguments: str) -> HttpResponse:
            turn = Turn(endpoint, client_ip(request.META.get("REMOTE_ADDR"), request.META.get("HTTP_X_FORWARDED_FOR")))
            if too_large := _headers_too_large(request):
                return await _refused(turn, too_large)
            if request.method not in method.split(", "):
                return await _refused(turn, _method_not_allowed(request, method))
            return await view(request, turn, **arguments)

        return endpoint_view

    return wrap


async def _authenticate(turn: Turn, request: HttpRequest) -> Identity:
    """An API key (`Authorization: Bearer ...`); or, for this site's own pages, the browser session — only with the
    page's CSRF token, so another site cannot spend a visitor's session — under the session limits."""
    started = time.perf_counter()
    authorization = request.headers.get("Authorization")
    if authorization is None and (key := request.headers.get("x-api-key")):  # Anthropic's SDK sends the key so
        authorization = f"Bearer {key}"
    if authorization is None and request.headers.get("X-CSRFToken") and await sync_to_async(_csrf_ok)(request):
        user = await request.auser()
        identity = identify_session(
            user.pk if user.is_authenticated else None, request.session.session_key or "", turn.ctx.client_ip
        )
    else:
        identity = known_key(authorization) or await sync_to_async(identify_key)(authorization)
    return turn.authenticated(identity, started)


def _checked(request: HttpRequest) -> HttpResponse:  # a view that is not exempt, for the check above
    return HttpResponse()


def _csrf_ok(request: HttpRequest) -> bool:
    """Django's own CSRF check (origin and token), asked for here because the API views are exempt from it."""
    if not request.session.session_key:
        return False
    return CsrfViewMiddleware(lambda r: HttpResponse()).process_view(request, _checked, (), {}) is None


async def _refused(
    turn: Turn, exc: BaseException, shape: Callable[[GatewayError, RequestContext], JsonResponse] = error_response
) -> JsonResponse:
    """The turn ended before generating: settle it and answer with the error in the API's `shape` (OpenAI's unless
    said; a client that left gets nothing)."""
    error = turn.fail(exc)
    await turn.settle()
    if isinstance(exc, asyncio.CancelledError):
        raise exc
    return shape(error, turn.ctx)


async def _generate_chat(turn: Turn, chat: ChatCompletionRequest, stream: bool, ignored: list[str]) -> None:
    """From the limits on, for every chat-shaped request (chat completions, and Responses and Messages as they
    translate): what the usage row keeps, the ignored fields' header, limits and route, then the generation."""
    turn.ctx.stream, turn.ctx.end_user = stream, chat.user or ""
    turn.ctx.prompt_text = json.dumps(chat.chat_messages, ensure_ascii=False)
    if ignored:
        turn.ctx.extra_headers["x-roundtrip-ignored-fields"] = ", ".join(ignored)
    await turn.admit(chat.model)
    await turn.generate(
        chat.chat_messages,
        chat.params,
        fit_max_tokens=not chat.max_tokens_given,
        n=chat.n,
        tools=chat.tool_definitions,
        continue_final=chat.continue_final_message,
        passthrough=chat.upstream_fields,
    )


def _event_stream(turn: Turn, events: AsyncIterator[bytes]) -> StreamingHttpResponse:
    headers = {**turn.ctx.headers(), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingHttpResponse(events, content_type="text/event-stream", headers=headers)


@api_view("POST", "chat.completions")
async def chat_completions(request: HttpRequest, turn: Turn) -> HttpResponse:
    try:
        await _authenticate(turn, request)
        body = _parsed(turn, request, ChatCompletionRequest)
        await _generate_chat(turn, body, body.stream, body.ignored_fields)
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc)
    choices = choices_for(body.n, body.logprobs, tools=bool(body.offered_tools))
    if body.stream:
        return _event_stream(turn, chat_stream(turn, body, choices))
    return await complete(turn, choices, lambda created: completion(turn, created, choices))


@api_view("POST", "completions")
async def completions(request: HttpRequest, turn: Turn) -> HttpResponse:
    """The legacy text completion: the prompt as raw text, no chat template."""
    try:
        await _authenticate(turn, request)
        body = _parsed(turn, request, CompletionRequest)
        turn.ctx.stream, turn.ctx.end_user, turn.ctx.prompt_text = body.stream, body.user or "", body.prompt_text
        await turn.admit(body.model)
        await turn.generate(
            [], body.params, fit_max_tokens=not body.max_tokens_given, n=body.n, prompt=body.prompt_text
        )
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc)
    choices = choices_for(body.n, body.logprobs is not None)
    echo = body.prompt_text if body.echo else ""
    if body.stream:
        return _event_stream(turn, text_stream(turn, body, choices, echo))
    return await complete(turn, choices, lambda created: text_completion(turn, created, choices, body.logprobs, echo))


@api_view("GET", "models")
async def models(request: HttpRequest, turn: Turn) -> HttpResponse:
    try:
        identity = await _authenticate(turn, request)
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc)
    await refresh()
    data = [await _model_object(r) for r in configured_models() if identity.may_use(r.id)]
    await turn.settle()
    return JsonResponse({"object": "list", "data": data}, headers=turn.ctx.headers())


@api_view("GET", "models.retrieve")
async def model(request: HttpRequest, turn: Turn, model_id: str) -> HttpResponse:
    """GET /v1/models/{id}: one model, by its id or an alias; 404 `model_not_found` for one this key may not use."""
    try:
        identity = await _authenticate(turn, request)
        route = resolve(model_id)
        if not identity.may_use(route.id):
            raise unknown_model(model_id)  # a key is not told of models it may not use
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc)
    data = await _model_object(route)
    await turn.settle()
    return JsonResponse(data, headers=turn.ctx.headers())


async def _model_object(route: ModelRoute) -> dict[str, Any]:
    """A model as OpenAI lists one, with its aliases and load state (fields clients ignore)."""
    return {
        "id": route.id,
        "object": "model",
        "created": 0,
        "owned_by": "roundtrip",
        "aliases": list(route.aliases),
        "status": await model_status(route),
    }


async def _tokenized(
    turn: Turn,
    identity: Identity,
    model: str,
    text: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[ModelRoute, wire.Tokens]:
    """The model's tokens for a text or a templated conversation; they are the request's usage."""
    route = route_model(turn.ctx, identity, model)
    answer = await client.tokenize(route, text, messages, tools)
    turn.usage.prompt_tokens = len(answer.ids)
    return route, answer


@api_view("POST", "tokenize")
async def tokenize(request: HttpRequest, turn: Turn) -> HttpResponse:
    """POST {"model", "text"} → the ids and token strings the model would see for that text."""
    try:
        identity = await _authenticate(turn, request)
        body = _parsed(turn, request, TokenizeRequest)
        route, answer = await _tokenized(
            turn, identity, body.model, body.text, body.chat_messages, body.tool_definitions
        )
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc)
    await turn.settle()
    out: dict[str, Any] = {
        "model": route.id,
        "ids": answer.ids,
        "tokens": answer.tokens,
        "spans": answer.spans,
        "count": len(answer.ids),
    }
    if body.messages is not None:
        out |= {"prompt": answer.text, "segments": wire.plain(answer.segments)}
    return JsonResponse(out)


@api_view("POST", "detokenize")
async def detokenize(request: HttpRequest, turn: Turn) -> HttpResponse:
    """POST {"model", "tokens": [ids]} → {"text"}: the text those tokens spell."""
    try:
        identity = await _authenticate(turn, request)
        body = _parsed(turn, request, DetokenizeRequest)
        route = route_model(turn.ctx, identity, body.model)
        text = await client.detokenize(route, body.tokens)
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc)
    turn.usage.prompt_tokens = len(body.tokens)
    await turn.settle()
    return JsonResponse({"model": route.id, "text": text})


async def openapi(request: HttpRequest) -> HttpResponse:
    return JsonResponse(openapi_spec(request.build_absolute_uri("/v1")))


@api_view("POST", "messages")
async def messages(request: HttpRequest, turn: Turn) -> HttpResponse:
    """Anthropic's Messages API, served as the chat request it translates to (`anthropic_protocol`)."""
    try:
        await _authenticate(turn, request)
        body = _parsed(turn, request, MessagesRequest)
        chat = body.as_chat()
        await _generate_chat(turn, chat, body.stream, [])
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc, anthropic_responses.error_response)
    choice = choices_for(1, False, tools=bool(chat.offered_tools))[0]
    if body.stream:
        return _event_stream(turn, anthropic_responses.message_stream(turn, choice))
    try:
        async for message in turn.messages():
            if isinstance(message, client.ChoiceEvent):
                choice.feed(message.event)
        return JsonResponse(anthropic_responses.message(turn, choice), headers=turn.ctx.headers())
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc, anthropic_responses.error_response)
    finally:
        await turn.settle()


@api_view("POST", "messages.count_tokens")
async def count_tokens(request: HttpRequest, turn: Turn) -> HttpResponse:
    """The prompt's tokens as the model would see them: `{"input_tokens": n}`."""
    try:
        identity = await _authenticate(turn, request)
        body = _parsed(turn, request, CountTokensRequest)
        tools = [t["function"] for t in body.chat_tools or ()] or None
        _, answer = await _tokenized(turn, identity, body.model, messages=body.chat_messages, tools=tools)
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc, anthropic_responses.error_response)
    await turn.settle()
    return JsonResponse({"input_tokens": len(answer.ids)}, headers=turn.ctx.headers())


@api_view("POST", "responses")
async def responses(request: HttpRequest, turn: Turn) -> HttpResponse:
    """OpenAI's Responses API, served as the chat request it translates to (`openai_responses_protocol`), continuing
    a stored response's conversation when given `previous_response_id`."""
    try:
        identity = await _authenticate(turn, request)
        body = _parsed(turn, request, ResponsesRequest)
        history: list[dict[str, Any]] = []
        if body.previous_response_id:
            history = await sync_to_async(stored_responses.conversation)(identity.bucket, body.previous_response_id)
        chat = body.as_chat(history)
        await _generate_chat(turn, chat, body.stream, body.ignored_fields)
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc)
    choice = choices_for(1, chat.logprobs, tools=bool(chat.offered_tools))[0]
    writer = ResponseWriter(turn, body, chat)
    if body.stream:
        return _event_stream(turn, openai_responses_output.event_stream(writer, choice, identity.bucket, history))
    try:
        answer = await openai_responses_output.whole(writer, choice)
        await openai_responses_output.keep(writer, identity.bucket, history)
        return JsonResponse(answer, headers=turn.ctx.headers())
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc)
    finally:
        await turn.settle()


@api_view("GET, DELETE", "responses.retrieve")
async def stored_response(request: HttpRequest, turn: Turn, response_id: str) -> HttpResponse:
    """GET /v1/responses/{id}: a stored response, as it was returned; DELETE: forget it. Only its owner sees it."""
    try:
        identity = await _authenticate(turn, request)
        if request.method == "DELETE":
            await sync_to_async(stored_responses.delete)(identity.bucket, response_id)
            answer = {"id": response_id, "object": "response.deleted", "deleted": True}
        else:
            answer = await sync_to_async(stored_responses.body)(identity.bucket, response_id)
    except (Exception, asyncio.CancelledError) as exc:
        return await _refused(turn, exc)
    await turn.settle()
    return JsonResponse(answer, headers=turn.ctx.headers())
