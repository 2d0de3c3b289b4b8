"""Rate limits and budgets in the Django cache: exact under parallel use, in local memory and in Redis."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.cache import cache
from django.test import override_settings

from webapp.gateway.errors import GatewayError
from webapp.gateway.limits import Limits, RateLimiter

T0 = 1_800_000_000.0  # a fixed clock: the start of a minute window
T0 -= T0 % 60


@pytest.fixture(autouse=True)
def _clear_cache() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


def _admitted_in_parallel(limits: Limits, attempts: int) -> int:
    def attempt(_: int) -> bool:
        try:
            RateLimiter("bucket", limits).admit(now=T0 + 1)
            return True
        except GatewayError:
            return False

    with ThreadPoolExecutor(16) as pool:
        return sum(pool.map(attempt, range(attempts)))


def test_requests_per_minute_hold_exactly_under_parallel_use() -> None:
    assert _admitted_in_parallel(Limits(requests_per_minute=7), 40) == 7


def test_requests_per_minute_hold_exactly_in_redis(redis_url: str) -> None:
    with override_settings(
        CACHES={"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url}}
    ):
        assert _admitted_in_parallel(Limits(requests_per_minute=7), 40) == 7
        assert _admitted_in_parallel(Limits(concurrent_streams=3), 20) == 3


def test_a_refusal_says_when_to_retry_and_reports_the_limits() -> None:
    limiter = RateLimiter("b", Limits(requests_per_minute=1, tokens_per_minute=100))
    state = limiter.admit(now=T0 + 15)
    assert state.headers()["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(GatewayError) as info:
        RateLimiter("b", Limits(requests_per_minute=1, tokens_per_minute=100)).admit(now=T0 + 15)
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "45"
    assert info.value.headers["x-ratelimit-limit-requests"] == "1"


def test_the_next_minute_starts_afresh() -> None:
    RateLimiter("b", Limits(requests_per_minute=1)).admit(now=T0 + 59)
    RateLimiter("b", Limits(requests_per_minute=1)).admit(now=T0 + 61)


def test_tokens_per_minute_refuse_once_spent() -> None:
    limits = Limits(tokens_per_minute=100)
    first = RateLimiter("b", limits)
    first.admit(now=T0)
    first.settle(100, now=T0 + 1)
    with pytest.raises(GatewayError) as info:
        RateLimiter("b", limits).admit(now=T0 + 2)
    assert info.value.code == "rate_limit_exceeded" and "tokens per minute" in info.value.message


def test_a_spent_budget_is_insufficient_quota_until_the_period_ends() -> None:
    limits = Limits(token_budget=50, budget_period="day")
    limiter = RateLimiter("b", limits)
    limiter.admit(now=T0)
    limiter.settle(60, now=T0)
    with pytest.raises(GatewayError) as info:
        RateLimiter("b", limits).admit(now=T0 + 120)
    assert info.value.code == "insufficient_quota" and int(info.value.headers["Retry-After"]) > 0
    RateLimiter("b", limits).admit(now=T0 + 86400)  # the next day


def test_a_spent_dollar_budget_is_insufficient_quota_until_the_period_ends() -> None:
    limits = Limits(spend_budget=0.01, budget_period="month")
    limiter = RateLimiter("b", limits)
    limiter.admit(now=T0)
    limiter.settle(100, now=T0, cost=0.006)
    RateLimiter("b", limits).admit(now=T0 + 60)  # $0.006 of $0.01 spent: still admitted
    RateLimiter("b", limits).settle(100, now=T0 + 60, cost=0.004)
    with pytest.raises(GatewayError) as info:
        RateLimiter("b", limits).admit(now=T0 + 120)
    assert info.value.code == "insufficient_quota" and "$0.010000 spent" in info.value.message
    RateLimiter("b", limits).admit(now=T0 + 31 * 86400)  # the next month


def test_concurrency_slots_come_back_on_release() -> None:
    limits = Limits(concurrent_streams=1)
    first = RateLimiter("b", limits)
    first.admit()
    with pytest.raises(GatewayError) as info:
        RateLimiter("b", limits).admit()
    assert info.value.code == "concurrency_limit_exceeded"
    first.release()
    first.release()  # idempotent
    RateLimiter("b", limits).admit()


def test_buckets_do_not_share_counts() -> None:
    RateLimiter("a", Limits(requests_per_minute=1)).admit(now=T0)
    RateLimiter("b", Limits(requests_per_minute=1)).admit(now=T0)
