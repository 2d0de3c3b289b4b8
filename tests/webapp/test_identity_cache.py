"""A key that passed is remembered for a few seconds (`webapp.gateway.identity`): the next request skips the database,
and a change to the key in this process is seen at once."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from webapp.gateway.errors import GatewayError
from webapp.gateway.identity import identify_key, known_key, renew
from webapp.keys.models import ApiKey

pytestmark = pytest.mark.django_db


def test_a_key_that_passed_is_known_without_a_query() -> None:
    _, raw = ApiKey.create_key("cached", requests_per_minute=7)
    assert known_key(f"Bearer {raw}") is None
    first = identify_key(f"Bearer {raw}")
    with CaptureQueriesContext(connection) as queries:
        again = known_key(f"Bearer {raw}")
    assert again == first and again.limits.requests_per_minute == 7 and len(queries) == 0
    assert known_key("Bearer rt-someone-else") is None and known_key(None) is None


def test_a_revoked_or_edited_key_is_looked_up_again_at_once() -> None:
    key, raw = ApiKey.create_key("revoked-later")
    identify_key(f"Bearer {raw}")
    key.revoke()
    assert known_key(f"Bearer {raw}") is None
    with pytest.raises(GatewayError, match="revoked"):
        identify_key(f"Bearer {raw}")


def test_a_remembered_key_that_expires_is_not_known(settings: Any) -> None:
    _, raw = ApiKey.create_key("expiring", expires_at=timezone.now() + timedelta(milliseconds=300))
    identify_key(f"Bearer {raw}")
    assert known_key(f"Bearer {raw}") is not None
    time.sleep(0.4)
    assert known_key(f"Bearer {raw}") is None


def test_with_no_time_to_remember_every_request_looks_the_key_up(settings: Any) -> None:
    settings.ROUNDTRIP_KEY_CACHE_SECONDS = 0
    _, raw = ApiKey.create_key("uncached")
    identify_key(f"Bearer {raw}")
    assert known_key(f"Bearer {raw}") is None


def test_a_key_in_use_is_renewed_after_its_request_so_the_next_one_needs_no_query(settings: Any) -> None:
    settings.ROUNDTRIP_KEY_CACHE_SECONDS = 0.4
    _, raw = ApiKey.create_key("busy")
    identity = identify_key(f"Bearer {raw}")
    with CaptureQueriesContext(connection) as queries:
        renew(identity)  # early in its time: nothing to do
    assert len(queries) == 0
    time.sleep(0.25)
    renew(identity)  # past half its time: looked up again
    time.sleep(0.25)  # past the first lookup's time, within the renewal's
    with CaptureQueriesContext(connection) as queries:
        assert known_key(f"Bearer {raw}") is not None
    assert len(queries) == 0


def test_renewing_a_key_revoked_by_another_process_forgets_it(settings: Any) -> None:
    settings.ROUNDTRIP_KEY_CACHE_SECONDS = 0.4
    key, raw = ApiKey.create_key("revoked-elsewhere")
    identity = identify_key(f"Bearer {raw}")
    ApiKey.objects.filter(pk=key.pk).update(is_active=False)  # no signal here: as if another process revoked it
    assert known_key(f"Bearer {raw}") is not None
    time.sleep(0.25)
    renew(identity)
    assert known_key(f"Bearer {raw}") is None
