"""API keys: shown once, stored hashed, revocable; the command and Django admin."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from webapp.keys.models import ApiKey, KeyRejected
from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db


def test_a_key_is_stored_only_as_its_hash() -> None:
    key, raw = ApiKey.create_key("ci")
    assert raw.startswith("rt-") and len(raw) > 40
    assert key.hashed_key == hashlib.sha256(raw.encode()).hexdigest()
    assert raw.startswith(key.prefix) and len(key.prefix) < 12
    assert raw not in str(ApiKey.objects.filter(pk=key.pk).values().get())


def test_it_authenticates_a_valid_key() -> None:
    key, raw = ApiKey.create_key("ci")
    assert ApiKey.authenticate(raw) == key


def test_it_rejects_revoked_key() -> None:
    key, raw = ApiKey.create_key("ci")
    key.revoke()
    with pytest.raises(KeyRejected, match="revoked"):
        ApiKey.authenticate(raw)


def test_it_rejects_expired_key() -> None:
    _, raw = ApiKey.create_key("ci", expires_at=timezone.now() - timedelta(minutes=1))
    with pytest.raises(KeyRejected, match="expired"):
        ApiKey.authenticate(raw)


def test_it_rejects_unknown_key() -> None:
    with pytest.raises(KeyRejected, match="Incorrect"):
        ApiKey.authenticate("rt-not-a-key")


def test_it_records_use_at_most_once_a_minute() -> None:
    key, raw = ApiKey.create_key("ci")
    start = timezone.now()
    ApiKey.authenticate(raw).touch(start)
    ApiKey.authenticate(raw).touch(start + timedelta(seconds=30))
    assert ApiKey.objects.get(pk=key.pk).last_used_at == start
    ApiKey.authenticate(raw).touch(start + timedelta(seconds=61))
    assert ApiKey.objects.get(pk=key.pk).last_used_at == start + timedelta(seconds=61)


def test_the_command_prints_the_key_once() -> None:
    out, err = StringIO(), StringIO()
    call_command("createapikey", "script", "--rpm", "5", "--models", "tiny", stdout=out, stderr=err)
    raw = out.getvalue().strip()
    key = ApiKey.authenticate(raw)
    assert (key.name, key.requests_per_minute, key.allowed_models) == ("script", 5, ["tiny"])
    assert "will not be shown again" in err.getvalue()


@pytest.fixture
def admin_client() -> Client:
    User.objects.create_superuser("admin", "admin@example.com", "a-long-password-1")
    client = Client()
    client.login(username="admin", password="a-long-password-1")
    return client


def test_admin_creates_a_key_and_shows_it_once(admin_client: Client) -> None:
    response = admin_client.post(
        "/admin/keys/apikey/add/",
        {
            "name": "from admin",
            "is_active": "on",
            "allowed_models": "[]",
            "requests_per_minute": 60,
            "tokens_per_minute": 1000,
            "concurrent_streams": 2,
            "token_budget": 0,
            "budget_period": "day",
            "spend_budget": 0,
        },
        follow=True,
    )
    messages = [str(m) for m in response.context["messages"]]
    shown = next(m for m in messages if "will not be shown again" in m)
    raw = shown.rsplit(" ", 1)[-1]
    key = ApiKey.authenticate(raw)
    assert key.name == "from admin" and key.hashed_key != raw
    assert raw not in admin_client.get(f"/admin/keys/apikey/{key.pk}/change/").content.decode()


def test_admin_revokes_in_one_click(admin_client: Client) -> None:
    key, raw = ApiKey.create_key("doomed")
    admin_client.post("/admin/keys/apikey/", {"action": "revoke_keys", "_selected_action": [key.pk]})
    key.refresh_from_db()
    assert not key.is_active and key.revoked_at is not None
    with pytest.raises(KeyRejected):
        ApiKey.authenticate(raw)


def test_admin_shows_usage(admin_client: Client) -> None:
    key, _ = ApiKey.create_key("busy")
    UsageRecord.objects.create(
        request_id="chatcmpl-abc",
        api_key=key,
        endpoint="chat.completions",
        model="tiny",
        status=200,
        finish_reason="stop",
        prompt_tokens=10,
        completion_tokens=5,
    )
    listing = admin_client.get("/admin/keys/apikey/").content.decode()
    assert "busy" in listing and ">15<" in listing
    other, _ = ApiKey.create_key("other")
    UsageRecord.objects.create(
        request_id="chatcmpl-other", api_key=other, endpoint="chat.completions", model="tiny", status=200
    )
    usage = admin_client.get(f"/admin/usage/usagerecord/?api_key__id__exact={key.pk}").content.decode()
    assert "chatcmpl-abc" in usage and "chatcmpl-other" not in usage  # the filter shows this key's rows only
