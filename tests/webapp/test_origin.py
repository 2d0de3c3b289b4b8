"""The socket's same-origin rule: scheme, host and port must all match the site."""

from __future__ import annotations

import pytest
from django.test import override_settings

from webapp.origin import same_origin


@pytest.mark.parametrize(
    ("origin", "host", "secure", "allowed"),
    [
        ("http://localhost:8000", "localhost:8000", False, True),
        ("http://LOCALHOST:8000", "localhost:8000", False, True),
        ("http://localhost:9999", "localhost:8000", False, False),  # another program on another port
        ("https://localhost:8000", "localhost:8000", False, False),  # another scheme
        ("http://127.0.0.1:8000", "localhost:8000", False, False),
        ("https://example.org", "example.org", True, True),  # default port filled in
        ("https://example.org:443", "example.org", True, True),
        ("http://example.org", "example.org", True, False),
        ("null", "localhost:8000", False, False),
        ("http://[::1]:8000", "[::1]:8000", False, True),
        ("http://localhost:notaport", "localhost:8000", False, False),
    ],
)
def test_it_compares_scheme_host_and_port(origin: str, host: str, secure: bool, allowed: bool) -> None:
    assert same_origin(origin, host, secure) is allowed


def test_a_trusted_origin_may_differ_from_the_host() -> None:
    with override_settings(CSRF_TRUSTED_ORIGINS=["https://chat.example.org"]):
        assert same_origin("https://chat.example.org", "10.0.0.5:8000", False)
        assert not same_origin("https://chat.example.org:8443", "10.0.0.5:8000", False)
