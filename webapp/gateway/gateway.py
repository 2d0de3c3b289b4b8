"""The gateway's checks, in order, each timed: authenticate, rate limits and budgets, route; then the usage log.

`RequestContext` is what the gateway knows about a request from its first byte: who, which model, its limiters,
the rate-limit state for the headers and the time every stage took. `record_usage` writes the usage row whatever
happened, and gives back the concurrency slot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from webapp.catalog import ModelRoute
from webapp.gateway.errors import GatewayError
from webapp.gateway.identity import Identity
from webapp.gateway.limits import Limits, RateLimiter, RateState
from webapp.gateway.routing import resolve
from webapp.usage.models import UsageRecord


@dataclass
class Stage:
    name: str
    seconds: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestContext:
    """What the gateway knows about a request from its first byte, passed or refused."""

    request_id: str
    endpoint: str
    client_ip: str | None
    stream: bool = False
    identity: Identity | None = None
    route: ModelRoute | None = None
    limiter: RateLimiter | None = None
    address_limiter: RateLimiter | None = None  # anonymous visitors' per-address bucket
    rate: RateState | None = None
    stages: list[Stage] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    prompt_text: str = ""
    worker: str = ""  # the inference worker that served it
    extra_headers: dict[str, str] = field(default_factory=dict)  # e.g. x-roundtrip-ignored-fields
    end_user: str = ""  # the client's own name for its user (OpenAI's `user`), kept in the usage row
    request_body: dict[str, Any] | None = None  # the JSON as it came, for observers (the staff watch page)

    def timed(self, name: str, started: float, **detail: Any) -> None:
        self.stages.append(Stage(name, time.perf_counter() - started, detail))

    @property
    def gateway_seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    def headers(self) -> dict[str, str]:
        out = self.rate.headers() if self.rate else {}
        out["x-request-id"] = self.request_id
        if self.worker:
            out["x-roundtrip-worker"] = self.worker
        out["x-roundtrip-gateway-ms"] = ";".join(f"{s.name}={s.seconds * 1000:.2f}" for s in self.stages)
        return out | self.extra_headers


def limit_and_route(ctx: RequestContext, identity: Identity, model: str) -> None:
    """Stages 2 and 3 (after authentication): rate limits and budgets, then the model. Raises GatewayError."""
    ctx.identity = identity
    started = time.perf_counter()
    if identity.address_bucket is not None:  # the address's limits first: a fresh session must not reset them
        by_address = RateLimiter(identity.address_bucket, Limits.from_dict(settings.ROUNDTRIP_ANONYMOUS_ADDRESS_LIMITS))
        by_address.admit()
        ctx.address_limiter = by_address
    limiter = RateLimiter(identity.bucket, identity.limits)
    try:
        ctx.rate = limiter.admit()
    except GatewayError:
        if ctx.address_limiter is not None:
            ctx.address_limiter.release()
        raise
    ctx.limiter = limiter
    ctx.timed("rate_limit", started, bucket=identity.bucket, **ctx.rate.counted)
    route_model(ctx, identity, model)


def route_model(ctx: RequestContext, identity: Identity, model: str) -> ModelRoute:
    """The route stage: 404 for an unknown model, 403 for one this key may not use."""
    started = time.perf_counter()
    route = resolve(model)
    if not identity.may_use(route.id):
        raise GatewayError(
            403,
            f"This API key may not use the model {route.id!r}.",
            "invalid_request_error",
            "model_not_allowed",
            "model",
        )
    ctx.route = route
    ctx.timed("route", started, model=route.id, channel=route.work_channel)
    return route


def record_usage(
    ctx: RequestContext,
    status: int,
    finish_reason: str = "",
    error_code: str = "",
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    ttft: float | None = None,
    cached_tokens: int = 0,
) -> UsageRecord:
    """The usage row for this request (and the gateway's counters); also settles its tokens and frees its concurrency
    slot."""
    started = time.perf_counter()
    identity = ctx.identity
    cost = ctx.route.cost(prompt_tokens, completion_tokens) if ctx.route else 0.0
    for limiter in (ctx.limiter, ctx.address_limiter):
        if limiter is not None:
            limiter.release()
            limiter.settle(prompt_tokens + completion_tokens, cost=cost)
    fields: dict[str, Any] = {
        "request_id": ctx.request_id,
        "api_key": identity.api_key if identity else None,
        "user_id": identity.user_id if identity else None,
        "session_key": identity.session_key if identity else "",
        "endpoint": ctx.endpoint,
        "model": ctx.route.id if ctx.route else "",
        "stream": ctx.stream,
        "status": status,
        "error_code": error_code or "",
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": cached_tokens,
        "cost_usd": cost,
        "worker": ctx.worker,
        "end_user": ctx.end_user[:256],
        "ttft_ms": None if ttft is None else ttft * 1000,
        "total_ms": (time.perf_counter() - ctx.started) * 1000,
        "client_ip": ctx.client_ip,
        "prompt_text": ctx.prompt_text if settings.ROUNDTRIP_STORE_PROMPTS else "",
    }
    try:
        with transaction.atomic():
            record = UsageRecord.objects.create(**fields)
    except IntegrityError:  # its key or user was deleted while it ran: the row is kept, as that deletion keeps rows
        record = UsageRecord.objects.create(**fields | {"api_key": None, "user_id": None})
    ctx.timed("usage_log", started)
    return record
