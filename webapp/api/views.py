"""The OpenAI-compatible HTTP API: thin async views over the gateway and the inference worker.

Each view authenticates, parses, passes the gateway's limits and routing, then talks to
the worker through `webapp.gateway.client`; every request leaves a usage row, whether it
succeeded, failed or its client left.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from webapp.api.completions import Assembler, chunk, completion, sse, timings
from webapp.api.openapi import openapi_spec
from webapp.api.protocol import ChatCompletionRequest, DetokenizeRequest, TokenizeRequest, json_body, parse
from webapp.gateway import client
from webapp.gateway.errors import GatewayError, bad_request
from webapp.gateway.gateway import RequestContext, limit_and_route, record_usage, route_model
from webapp.gateway.identity import Identity, identify_key, identify_session
from webapp.gateway.routing import configured_models
from webapp.gateway.watch import anyone_watching, publish
from webapp.worker.registry import model_load


def _error(exc: GatewayError, ctx: RequestContext | None = None) -> JsonResponse:
    headers = {**(ctx.headers() if ctx else {}), **exc.headers}
    return JsonResponse(exc.body(), status=exc.status, headers=headers)


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        raw = request.body
    except RequestDataTooBig:
        raise GatewayError(413, "The request body is too large.", "invalid_request_error", "request_too_large") from None
    return json_body(raw)


def _method_not_allowed(request: HttpRequest, allowed: str) -> JsonResponse:
    exc = GatewayError(405, f"Method {request.method} is not allowed here; use {allowed}.", "invalid_request_error", "method_not_allowed")
    return JsonResponse(exc.body(), status=405, headers={"Allow": allowed})


ApiView = Callable[[HttpRequest, RequestContext], Awaitable[HttpResponse]]


def api_view(method: str, endpoint: str) -> Callable[[ApiView], Callable[[HttpRequest], Awaitable[HttpResponse]]]:
    """An API endpoint: one method (405 in OpenAI's shape otherwise), no CSRF (keys, not cookies), a RequestContext."""

    def wrap(view: ApiView) -> Callable[[HttpRequest], Awaitable[HttpResponse]]:
        @csrf_exempt
        @functools.wraps(view)
        async def endpoint_view(request: HttpRequest) -> HttpResponse:
            if request.method != method:
                return _method_not_allowed(request, method)
            return await view(request, RequestContext(client.new_request_id(), endpoint, request.META.get("REMOTE_ADDR")))

        return endpoint_view

    return wrap


async def _authenticate(ctx: RequestContext, request: HttpRequest) -> Identity:
    """An API key (`Authorization: Bearer ...`); or, for this site's own pages, the browser session — only with the
    page's CSRF token, so another site cannot spend a visitor's session — under the session limits."""
    started = time.perf_counter()
    authorization = request.headers.get("Authorization")
    if authorization is None and request.headers.get("X-CSRFToken") and await sync_to_async(_csrf_ok)(request):
        user = await request.auser()
        identity = identify_session(user.pk if user.is_authenticated else None, request.session.session_key or "")
    else:
        identity = await sync_to_async(identify_key)(authorization)
    ctx.identity = identity
    ctx.timed("authenticate", started, who=identity.label)
    return identity


def _checked(request: HttpRequest) -> HttpResponse:  # a view that is not exempt, for the check above
    return HttpResponse()


def _csrf_ok(request: HttpRequest) -> bool:
    """Django's own CSRF check (origin and token), asked for here because the API views are exempt from it."""
    if not request.session.session_key:
        return False
    return CsrfViewMiddleware(lambda r: HttpResponse()).process_view(request, _checked, (), {}) is None


@api_view("POST", "chat.completions")
async def chat_completions(request: HttpRequest, ctx: RequestContext) -> HttpResponse:
    try:
        identity = await _authenticate(ctx, request)
        body: ChatCompletionRequest = parse(ChatCompletionRequest, _body(request))
        ctx.stream = body.stream
        ctx.prompt_text = json.dumps(body.chat_messages, ensure_ascii=False)
        if body.ignored_fields:
            ctx.extra_headers["x-roundtrip-ignored-fields"] = ", ".join(body.ignored_fields)
        await sync_to_async(limit_and_route)(ctx, identity, body.model)
        assert ctx.route is not None
        generation = await client.generate(
            ctx.route, body.chat_messages, body.params, "off", ctx.request_id, fit_max_tokens=not body.max_tokens_given
        )
    except GatewayError as exc:
        await sync_to_async(record_usage)(ctx, exc.status, "error", exc.code or exc.type)
        return _error(exc, ctx)
    if generation.worker:
        ctx.worker = generation.worker
    if body.stream:
        headers = {**ctx.headers(), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingHttpResponse(_stream(ctx, body, generation), content_type="text/event-stream", headers=headers)
    return await _complete(ctx, body, generation)


async def _events(ctx: RequestContext, generation: client.Generation) -> AsyncIterator[dict[str, Any]]:
    """The generation's events, also shown to staff on the watch page while anyone is watching."""
    watched = await anyone_watching()
    if watched:
        await publish({"type": "request", "request_id": ctx.request_id, "source": ctx.identity.label if ctx.identity else "", "model": ctx.route.id if ctx.route else ""})
    async for event in generation.events():
        if watched:
            await publish({"type": "trace", "request_id": ctx.request_id, "event": event})
        yield event


async def _complete(ctx: RequestContext, body: ChatCompletionRequest, generation: client.Generation) -> HttpResponse:
    assembler = Assembler(body.logprobs, generation.accepted.get("prompt_tokens", 0))
    status, error_code = 200, ""
    try:
        async for event in _events(ctx, generation):
            assembler.feed(event)
        result = completion(ctx, int(time.time()), assembler)
        return JsonResponse(result, headers={**ctx.headers(), "x-roundtrip-timings": json.dumps(result["roundtrip_timings"])})
    except GatewayError as exc:
        status, error_code = exc.status, exc.code or exc.type
        await asyncio.shield(generation.cancel())
        return _error(exc, ctx)
    except asyncio.CancelledError:  # the client left: stop the model
        status, error_code = 499, "client_closed_request"
        await asyncio.shield(generation.cancel())
        raise
    except Exception as exc:
        status, error_code = 500, "server_error"
        await asyncio.shield(generation.cancel())
        return _error(_server_error(exc), ctx)
    finally:
        generation.close()
        await _settle(ctx, assembler, status, error_code)


def _server_error(exc: Exception) -> GatewayError:
    return GatewayError(500, f"The server failed: {type(exc).__name__}: {exc}", "server_error", "server_error")


async def _stream(ctx: RequestContext, body: ChatCompletionRequest, generation: client.Generation) -> AsyncIterator[bytes]:
    """SSE exactly as OpenAI's clients read it; the role chunk goes out with the first token."""
    created = int(time.time())
    assembler = Assembler(body.logprobs, generation.accepted.get("prompt_tokens", 0))
    status, error_code = 200, ""
    started = False
    try:
        try:
            async for event in _events(ctx, generation):
                piece = assembler.feed(event)
                if piece is None:
                    continue
                if not started:
                    started = True
                    yield sse(chunk(ctx, created, {"role": "assistant", "content": ""}, logprobs=[] if body.logprobs else None))
                content = chunk(ctx, created, {"content": piece.text}, logprobs=piece.logprobs if body.logprobs else None)
                if body.continuous_usage:
                    content["usage"] = assembler.usage()  # the running counts, as vLLM sends them
                yield sse(content)
            if not started:
                yield sse(chunk(ctx, created, {"role": "assistant", "content": ""}))
            yield sse(chunk(ctx, created, {}, assembler.finish_reason, roundtrip_timings=timings(ctx, assembler)))
            if body.include_usage:
                usage_chunk = chunk(ctx, created, {}) | {"choices": [], "usage": assembler.usage()}
                yield sse(usage_chunk)
        except GatewayError as exc:  # after the stream started: an error event, then [DONE]
            status, error_code = exc.status, exc.code or exc.type
            await asyncio.shield(generation.cancel())
            yield sse(exc.body())
        except Exception as exc:
            status, error_code = 500, "server_error"
            await asyncio.shield(generation.cancel())
            yield sse(_server_error(exc).body())
        yield sse("[DONE]")
    except (asyncio.CancelledError, GeneratorExit):  # the client left mid-stream: stop the model within one token
        status, error_code = 499, "client_closed_request"
        await asyncio.shield(generation.cancel())
        raise
    finally:
        generation.close()
        await _settle(ctx, assembler, status, error_code)


async def _settle(ctx: RequestContext, assembler: Assembler, status: int, error_code: str) -> None:
    usage = assembler.usage()
    ttft = None if assembler.first_token_at is None else assembler.first_token_at - ctx.started
    finish = assembler.finish_reason if status == 200 else ("cancelled" if status == 499 else "error")
    await asyncio.shield(
        sync_to_async(record_usage)(ctx, status, finish, error_code, usage["prompt_tokens"], usage["completion_tokens"], ttft,
                                    usage["prompt_tokens_details"]["cached_tokens"])
    )


@api_view("GET", "models")
async def models(request: HttpRequest, ctx: RequestContext) -> HttpResponse:
    try:
        identity = await _authenticate(ctx, request)
    except GatewayError as exc:
        return _error(exc, ctx)
    data = [
        {"id": r.id, "object": "model", "created": 0, "owned_by": "roundtrip", "aliases": list(r.aliases), "status": await sync_to_async(model_load)(r.id)}
        for r in configured_models()
        if identity.may_use(r.id)
    ]
    return JsonResponse({"object": "list", "data": data})


@api_view("POST", "tokenize")
async def tokenize(request: HttpRequest, ctx: RequestContext) -> HttpResponse:
    """POST {"model", "text"} → the ids and token strings the model would see for that text."""
    try:
        identity = await _authenticate(ctx, request)
        body: TokenizeRequest = parse(TokenizeRequest, _body(request))
        route = route_model(ctx, identity, body.model)
        answer = await client.tokenize(route, body.text, body.chat_messages)
    except GatewayError as exc:
        await sync_to_async(record_usage)(ctx, exc.status, "error", exc.code or exc.type)
        return _error(exc, ctx)
    await sync_to_async(record_usage)(ctx, 200, "", "", len(answer["ids"]))
    out = {"model": route.id, "ids": answer["ids"], "tokens": answer["tokens"], "spans": answer["spans"], "count": len(answer["ids"])}
    if body.messages is not None:
        out |= {"prompt": answer["text"], "segments": answer["segments"]}
    return JsonResponse(out)


@api_view("POST", "detokenize")
async def detokenize(request: HttpRequest, ctx: RequestContext) -> HttpResponse:
    """POST {"model", "tokens": [ids]} → {"text"}: the text those tokens spell."""
    try:
        identity = await _authenticate(ctx, request)
        body: DetokenizeRequest = parse(DetokenizeRequest, _body(request))
        route = route_model(ctx, identity, body.model)
        text = await client.detokenize(route, body.tokens)
    except GatewayError as exc:
        await sync_to_async(record_usage)(ctx, exc.status, "error", exc.code or exc.type)
        return _error(exc, ctx)
    await sync_to_async(record_usage)(ctx, 200, "", "", len(body.tokens))
    return JsonResponse({"model": route.id, "text": text})


async def openapi(request: HttpRequest) -> HttpResponse:
    return JsonResponse(openapi_spec(request.build_absolute_uri("/v1")))
