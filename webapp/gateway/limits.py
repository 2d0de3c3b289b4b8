"""Rate limits and budgets, counted in the Django cache so that Redis makes them shared across processes.

Fixed one-minute windows for requests and tokens, a counter for concurrent streams and
a per-day or per-month token budget. Requests are counted before they run (`admit`);
tokens after, when the usage is known (`settle`). A request is refused while the
window's or the period's tokens are already spent. Cache `incr` is atomic both in
local memory and in Redis, which is what makes the limits exact under parallel requests.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.core.cache import cache

from webapp.gateway.errors import GatewayError

WINDOW = 60  # seconds
STREAM_SLOT_TTL = 3600  # a crashed process cannot hold a concurrency slot longer than this
NANO = 1_000_000_000  # spend is counted in billionths of a dollar: a whole number the cache adds atomically


@dataclass(frozen=True)
class Limits:
    """0 means unlimited."""

    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    concurrent_streams: int = 0
    token_budget: int = 0
    budget_period: str = "day"
    spend_budget: float = 0.0  # US dollars per budget period, at the models' prices

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Limits:
        return cls(
            requests_per_minute=int(values.get("requests_per_minute", 0)),
            tokens_per_minute=int(values.get("tokens_per_minute", 0)),
            concurrent_streams=int(values.get("concurrent_streams", 0)),
            token_budget=int(values.get("tokens_per_day", values.get("token_budget", 0))),
            budget_period=str(values.get("budget_period", "day")),
            spend_budget=float(values.get("spend_budget", 0)),
        )


@dataclass(frozen=True)
class RateState:
    """What the x-ratelimit-* headers report after this request was counted."""

    limit_requests: int
    remaining_requests: int
    reset_requests: float
    limit_tokens: int
    remaining_tokens: int
    reset_tokens: float
    counted: dict[str, int]  # before/after numbers for the trace's gauge

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.limit_requests:
            out |= {
                "x-ratelimit-limit-requests": str(self.limit_requests),
                "x-ratelimit-remaining-requests": str(self.remaining_requests),
                "x-ratelimit-reset-requests": f"{self.reset_requests:.0f}s",
            }
        if self.limit_tokens:
            out |= {
                "x-ratelimit-limit-tokens": str(self.limit_tokens),
                "x-ratelimit-remaining-tokens": str(self.remaining_tokens),
                "x-ratelimit-reset-tokens": f"{self.reset_tokens:.0f}s",
            }
        return out


def _window(now: float) -> tuple[int, float]:
    start = int(now // WINDOW) * WINDOW
    return start, start + WINDOW - now


def _budget_period(period: str, now: float) -> tuple[str, float]:
    """The period's label and the seconds until it ends (UTC)."""
    day = datetime.fromtimestamp(now, UTC)
    if period == "month":
        nxt = datetime(day.year + (day.month == 12), day.month % 12 + 1, 1, tzinfo=UTC)
        return day.strftime("%Y-%m"), nxt.timestamp() - now
    midnight = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() + 86400
    return day.strftime("%Y-%m-%d"), midnight - now


def _incr(key: str, amount: int, ttl: int) -> int:
    cache.add(key, 0, ttl)
    try:
        return int(cache.incr(key, amount))
    except ValueError:  # expired between add and incr
        cache.add(key, 0, ttl)
        return int(cache.incr(key, amount))


def _too_many(message: str, retry_after: float, code: str, headers: dict[str, str]) -> GatewayError:
    wait = max(1, int(retry_after + 0.999))
    return GatewayError(
        429,
        message,
        "rate_limit_exceeded" if code != "insufficient_quota" else "insufficient_quota",
        code,
        None,
        {"Retry-After": str(wait), **headers},
    )


class RateLimiter:
    """Counts one identity's ("bucket's") use against its Limits."""

    def __init__(self, bucket: str, limits: Limits) -> None:
        self.bucket = bucket
        self.limits = limits
        self._holding_stream = False

    def admit(self, now: float | None = None) -> RateState:
        """Count the request; 429 GatewayError (with Retry-After and x-ratelimit-*) when over a limit."""
        now = time.time() if now is None else now
        lim = self.limits
        start, reset = _window(now)
        tokens_key = f"rt:tpm:{self.bucket}:{start}"
        used_tokens = int(cache.get(tokens_key, 0))
        state_tokens = max(0, lim.tokens_per_minute - used_tokens) if lim.tokens_per_minute else 0
        counted: dict[str, int] = {"tokens_used_before": used_tokens}
        if lim.tokens_per_minute and used_tokens >= lim.tokens_per_minute:
            raise _too_many(
                f"Rate limit reached: {lim.tokens_per_minute} tokens per minute. Try again in {reset:.0f}s.",
                reset,
                "rate_limit_exceeded",
                RateState(lim.requests_per_minute, 0, reset, lim.tokens_per_minute, 0, reset, counted).headers(),
            )
        self._check_budgets(now, counted)
        remaining_requests = 0
        if lim.requests_per_minute:
            count = _incr(f"rt:rpm:{self.bucket}:{start}", 1, WINDOW + 5)
            counted["requests_before"] = count - 1
            counted["requests_after"] = count
            remaining_requests = max(0, lim.requests_per_minute - count)
            if count > lim.requests_per_minute:
                raise _too_many(
                    f"Rate limit reached: {lim.requests_per_minute} requests per minute. Try again in {reset:.0f}s.",
                    reset,
                    "rate_limit_exceeded",
                    RateState(
                        lim.requests_per_minute, 0, reset, lim.tokens_per_minute, state_tokens, reset, counted
                    ).headers(),
                )
        if lim.concurrent_streams:
            streams = _incr(f"rt:streams:{self.bucket}", 1, STREAM_SLOT_TTL)
            self._holding_stream = True
            counted["streams"] = streams
            if streams > lim.concurrent_streams:
                self.release()
                raise _too_many(
                    f"Too many concurrent requests: at most {lim.concurrent_streams} at a time.",
                    1,
                    "concurrency_limit_exceeded",
                    {},
                )
        return RateState(
            lim.requests_per_minute, remaining_requests, reset, lim.tokens_per_minute, state_tokens, reset, counted
        )

    def _check_budgets(self, now: float, counted: dict[str, int]) -> None:
        """429 `insufficient_quota` while the period's token or spend budget is already used up."""
        lim = self.limits
        if lim.token_budget:
            label, period_left = _budget_period(lim.budget_period, now)
            spent = int(cache.get(f"rt:budget:{self.bucket}:{label}", 0))
            counted["budget_used"] = spent
            if spent >= lim.token_budget:
                raise _too_many(
                    f"Token budget exhausted: {lim.token_budget} tokens per {lim.budget_period}.",
                    period_left,
                    "insufficient_quota",
                    {},
                )
        if lim.spend_budget:
            label, period_left = _budget_period(lim.budget_period, now)
            spent = int(cache.get(f"rt:spend:{self.bucket}:{label}", 0))
            counted["spend_used_nano_usd"] = spent
            if spent >= lim.spend_budget * NANO:
                raise _too_many(
                    f"Spend budget exhausted: ${lim.spend_budget:g} per {lim.budget_period} "
                    f"(${spent / NANO:.6f} spent at the models' prices).",
                    period_left,
                    "insufficient_quota",
                    {},
                )

    def release(self) -> None:
        """Give back the concurrency slot taken by `admit` (idempotent)."""
        if self._holding_stream:
            self._holding_stream = False
            with contextlib.suppress(ValueError):  # the slot counter expired: nothing left to give back
                cache.decr(f"rt:streams:{self.bucket}")

    def settle(self, tokens: int, now: float | None = None, cost: float = 0.0) -> None:
        """Charge the tokens a finished request used (and what they cost, in US dollars) to the minute window and the
        budget period."""
        if tokens <= 0:
            return
        now = time.time() if now is None else now
        if self.limits.spend_budget and cost > 0:
            label, left = _budget_period(self.limits.budget_period, now)
            _incr(f"rt:spend:{self.bucket}:{label}", round(cost * NANO), int(left) + 3600)
        start, _ = _window(now)
        if self.limits.tokens_per_minute:
            _incr(f"rt:tpm:{self.bucket}:{start}", tokens, WINDOW + 5)
        if self.limits.token_budget:
            label, left = _budget_period(self.limits.budget_period, now)
            _incr(f"rt:budget:{self.bucket}:{label}", tokens, int(left) + 3600)
