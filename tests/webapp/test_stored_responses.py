"""Stored Responses API answers (`webapp.api.stored_responses`): only their owner finds them, they expire, and the
store keeps at most ROUNDTRIP_RESPONSES_KEEP of them, the oldest going first."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from webapp.api import stored_responses
from webapp.api.models import StoredResponse
from webapp.gateway.errors import GatewayError

pytestmark = pytest.mark.django_db
TURN = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]


def response(n: int) -> dict[str, Any]:
    return {"id": f"resp_{n}", "model": "tiny", "object": "response", "output": []}


def test_only_the_owner_finds_continues_and_deletes_a_response() -> None:
    stored_responses.save("key:1", response(1), TURN)
    assert stored_responses.body("key:1", "resp_1")["id"] == "resp_1"
    assert stored_responses.conversation("key:1", "resp_1") == TURN
    with pytest.raises(GatewayError) as refused:
        stored_responses.conversation("key:2", "resp_1")
    assert (refused.value.status, refused.value.param) == (404, "previous_response_id")
    with pytest.raises(GatewayError):
        stored_responses.delete("key:2", "resp_1")
    stored_responses.delete("key:1", "resp_1")
    with pytest.raises(GatewayError):
        stored_responses.body("key:1", "resp_1")


def test_an_expired_response_is_gone_and_the_next_save_removes_it() -> None:
    stored_responses.save("key:1", response(1), TURN)
    StoredResponse.objects.filter(id="resp_1").update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(GatewayError):
        stored_responses.body("key:1", "resp_1")
    stored_responses.save("key:1", response(2), TURN)
    assert list(StoredResponse.objects.values_list("id", flat=True)) == ["resp_2"]


@override_settings(ROUNDTRIP_RESPONSES_KEEP=2)
def test_at_most_the_configured_number_are_kept_the_oldest_going_first() -> None:
    for n in range(4):
        stored_responses.save("key:1", response(n), TURN)
        StoredResponse.objects.filter(id=f"resp_{n}").update(created_at=timezone.now() - timedelta(minutes=10 - n))
    stored_responses.save("key:1", response(9), TURN)
    assert sorted(StoredResponse.objects.values_list("id", flat=True)) == ["resp_3", "resp_9"]
