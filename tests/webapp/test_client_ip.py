"""Anonymous visitors are limited by address, and a forwarded address is believed only from a trusted proxy."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import override_settings

from webapp.gateway.client_ip import client_ip
from webapp.gateway.errors import GatewayError
from webapp.gateway.identity import identify_session
from webapp.gateway.limits import RateLimiter


def test_it_ignores_x_forwarded_for_from_anyone_but_a_trusted_proxy() -> None:
    with override_settings(ROUNDTRIP_TRUSTED_PROXIES=["10.0.0.1"]):
        assert client_ip("203.0.113.9", "1.2.3.4") == "203.0.113.9"  # a client cannot pick its own bucket
        assert client_ip("10.0.0.1", "1.2.3.4, 198.51.100.7") == "198.51.100.7"  # the address the proxy saw
        assert client_ip("10.0.0.1", "198.51.100.7, 10.0.0.1") == "198.51.100.7"
        assert client_ip("10.0.0.1", None) == "10.0.0.1"


def test_a_fresh_cookie_per_turn_does_not_reset_the_anonymous_limits() -> None:
    cache.clear()
    with override_settings(ROUNDTRIP_ANONYMOUS_LIMITS={"requests_per_minute": 2}):
        for turn in range(2):
            RateLimiter(*_bucket_and_limits(f"session-{turn}")).admit()
        with pytest.raises(GatewayError) as refused:
            RateLimiter(*_bucket_and_limits("session-fresh")).admit()
    assert refused.value.status == 429


def _bucket_and_limits(session_key: str) -> tuple[str, object]:
    identity = identify_session(None, session_key, "203.0.113.9")
    assert identity.bucket == "ip:203.0.113.9"
    return identity.bucket, identity.limits
