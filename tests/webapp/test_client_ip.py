"""Anonymous visitors are limited by address, and a forwarded address is believed only from a trusted proxy."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import override_settings

from webapp.gateway.client_ip import client_ip
from webapp.gateway.errors import GatewayError
from webapp.gateway.gateway import RequestContext, limit_and_route
from webapp.gateway.identity import identify_session


def test_it_ignores_x_forwarded_for_from_anyone_but_a_trusted_proxy() -> None:
    with override_settings(ROUNDTRIP_TRUSTED_PROXIES=["10.0.0.1"]):
        assert client_ip("203.0.113.9", "1.2.3.4") == "203.0.113.9"  # a client cannot pick its own bucket
        assert client_ip("10.0.0.1", "1.2.3.4, 198.51.100.7") == "198.51.100.7"  # the address the proxy saw
        assert client_ip("10.0.0.1", "198.51.100.7, 10.0.0.1") == "198.51.100.7"
        assert client_ip("10.0.0.1", None) == "10.0.0.1"


@pytest.mark.django_db
def test_a_fresh_cookie_per_turn_does_not_reset_the_address_limits() -> None:
    cache.clear()
    with override_settings(
        ROUNDTRIP_ANONYMOUS_LIMITS={"requests_per_minute": 5},
        ROUNDTRIP_ANONYMOUS_ADDRESS_LIMITS={"requests_per_minute": 2},
        ROUNDTRIP_MODELS=[{"id": "tiny", "path": "", "aliases": []}],
    ):
        for turn in range(2):
            _admit(f"session-{turn}", "203.0.113.9")
        with pytest.raises(GatewayError) as refused:
            _admit("session-fresh", "203.0.113.9")
        _admit("session-fresh", "198.51.100.7")  # another address has its own count
    assert refused.value.status == 429


def _admit(session_key: str, address: str) -> None:
    ctx = RequestContext("chatcmpl-x", "chat.completions", address)
    limit_and_route(ctx, identify_session(None, session_key, address), "tiny")
