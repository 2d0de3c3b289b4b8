"""Keeping, finding and deleting Responses API answers, each visible only to its owner (the identity's rate-limit
bucket: an API key, a signed-in user, a browser session). Bounded by ROUNDTRIP_RESPONSES_KEEP rows and
ROUNDTRIP_RESPONSES_DAYS days: every save drops what has expired and the oldest beyond the bound."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from webapp.api.models import StoredResponse
from webapp.gateway.errors import GatewayError


def not_found(response_id: str, param: str | None = None) -> GatewayError:
    return GatewayError(
        404,
        f"No response with id '{response_id}' is stored here (never stored, expired, deleted, or another key's).",
        "invalid_request_error",
        "response_not_found",
        param,
    )


def _live(owner: str, response_id: str, param: str | None = None) -> StoredResponse:
    found = StoredResponse.objects.filter(id=response_id, owner=owner, expires_at__gt=timezone.now()).first()
    if found is None:
        raise not_found(response_id, param)
    return found


def conversation(owner: str, response_id: str) -> list[dict[str, Any]]:
    """The chat messages a `previous_response_id` continues; 404 naming the field when there is no such response."""
    return list(_live(owner, response_id, "previous_response_id").conversation)


def body(owner: str, response_id: str) -> dict[str, Any]:
    stored: dict[str, Any] = _live(owner, response_id).body
    return stored


def delete(owner: str, response_id: str) -> None:
    _live(owner, response_id).delete()


def save(owner: str, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    """Keep `response` and its conversation; drop what has expired and the oldest beyond the bound."""
    now = timezone.now()
    StoredResponse.objects.create(
        id=response["id"],
        owner=owner,
        expires_at=now + timedelta(days=settings.ROUNDTRIP_RESPONSES_DAYS),
        model=response["model"],
        body=response,
        conversation=messages,
    )
    StoredResponse.objects.filter(expires_at__lte=now).delete()
    keep = settings.ROUNDTRIP_RESPONSES_KEEP
    oldest_kept = StoredResponse.objects.order_by("-created_at").values_list("created_at", flat=True)[keep - 1 : keep]
    if oldest_kept:
        StoredResponse.objects.filter(created_at__lt=oldest_kept[0]).delete()
