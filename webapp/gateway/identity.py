"""Who is asking: an API key from the Authorization header, else the browser's Django session.

A key that passed is remembered in this process for `ROUNDTRIP_KEY_CACHE_SECONDS`, so the next request with it is
let in without a database query or a thread hop (about 1.5 ms of every request's time to first token). A change to
the key in this process (revoked, edited, deleted) forgets it at once; one made by another process takes effect
here within those seconds. Expiry is checked on every request. A key in use is looked up again after its requests
(`renew`), not before them, so a client that keeps calling never waits for the database.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

from webapp.gateway.errors import GatewayError
from webapp.gateway.limits import Limits
from webapp.keys.models import TOUCH_INTERVAL, ApiKey, KeyRejected, hash_key


@dataclass(frozen=True)
class Identity:
    kind: str  # "key", "user" or "anonymous"
    bucket: str  # the rate-limit bucket
    limits: Limits
    api_key: ApiKey | None = None
    user_id: int | None = None
    session_key: str = ""
    address_bucket: str | None = None  # anonymous visitors: also counted per client address (see limit_and_route)

    @property
    def label(self) -> str:
        if self.api_key is not None:
            return f"API key {self.api_key.prefix}…"
        return "signed-in user" if self.kind == "user" else "anonymous visitor"

    def may_use(self, model_id: str) -> bool:
        return self.api_key is None or self.api_key.allows_model(model_id)


def _unauthorized(message: str) -> GatewayError:
    return GatewayError(401, message, "invalid_request_error", "invalid_api_key")


_known: dict[str, tuple[float, Identity]] = {}  # key hash -> (monotonic deadline, identity)


def _raw_key(authorization: str | None) -> str:
    if not authorization:
        raise _unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer rt-...'.")
    scheme, _, raw = authorization.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise _unauthorized("Malformed Authorization header; expected 'Bearer <API key>'.")
    return raw.strip()


def known_key(authorization: str | None) -> Identity | None:
    """The identity of a key let in moments ago (no database, safe on the event loop); None when it must be looked
    up (`identify_key`): unknown here, remembered too long, expired, or due for its `last_used_at`."""
    try:
        hashed = hash_key(_raw_key(authorization))
    except GatewayError:
        return None
    found = _known.get(hashed)
    if found is None:
        return None
    deadline, identity = found
    key = identity.api_key
    now = timezone.now()
    if time.monotonic() > deadline or key is None or _stale(key.last_used_at, now) or _expired(key.expires_at, now):
        _known.pop(hashed, None)
        return None
    return identity


def _stale(last_used: datetime | None, now: datetime) -> bool:
    return last_used is None or now - last_used >= TOUCH_INTERVAL


def _expired(expires_at: datetime | None, now: datetime) -> bool:
    return expires_at is not None and expires_at <= now


@receiver([post_save, post_delete], sender=ApiKey)
def _forget_key(instance: ApiKey, **kwargs: Any) -> None:
    """A key changed in this process: the next request looks it up again."""
    _known.pop(instance.hashed_key, None)


def identify_key(authorization: str | None) -> Identity:
    """The identity behind `Authorization: Bearer <key>`; 401 for a missing, unknown, revoked or expired key."""
    raw = _raw_key(authorization)
    try:
        key = ApiKey.authenticate(raw)
    except KeyRejected as exc:
        raise _unauthorized(exc.reason) from None
    key.touch()
    identity = _identity(key)
    if settings.ROUNDTRIP_KEY_CACHE_SECONDS > 0:
        _known[key.hashed_key] = (time.monotonic() + settings.ROUNDTRIP_KEY_CACHE_SECONDS, identity)
    return identity


def renew(identity: Identity) -> None:
    """After a keyed request has been answered (on the thread that writes its usage row): a remembered key past half
    its time here, or soon due for its `last_used_at`, is looked up again now, so the next request with it is let in
    from memory instead of waiting for the database. A key revoked, deleted or expired meanwhile is forgotten at once;
    one never renewed is still forgotten when its time runs out, so a revocation elsewhere takes effect here within
    `ROUNDTRIP_KEY_CACHE_SECONDS`, as before."""
    key, window = identity.api_key, settings.ROUNDTRIP_KEY_CACHE_SECONDS
    found = _known.get(key.hashed_key) if key is not None else None
    if key is None or found is None or window <= 0:
        return
    now = timezone.now()
    touch_soon = _stale(key.last_used_at, now + timedelta(seconds=window))
    if found[0] - time.monotonic() > window / 2 and not touch_soon:
        return
    fresh = ApiKey.objects.filter(pk=key.pk).first()
    if fresh is None or not fresh.is_active or _expired(fresh.expires_at, now):
        _known.pop(key.hashed_key, None)
        return
    fresh.touch(now)
    _known[key.hashed_key] = (time.monotonic() + window, _identity(fresh))


def _identity(key: ApiKey) -> Identity:
    limits = Limits(
        key.requests_per_minute,
        key.tokens_per_minute,
        key.concurrent_streams,
        key.token_budget,
        key.budget_period,
        key.spend_budget,
    )
    return Identity("key", f"key:{key.pk}", limits, api_key=key, user_id=key.owner_id)


def identify_session(user_id: int | None, session_key: str, client_ip: str | None = None) -> Identity:
    """A browser visitor: signed-in users and anonymous visitors get the limits configured for them. Anonymous
    visitors are also counted per address, under looser limits (many people may share one address), so a fresh
    cookie before each turn does not mean fresh limits."""
    if user_id is not None:
        return Identity(
            "user",
            f"user:{user_id}",
            Limits.from_dict(settings.ROUNDTRIP_USER_LIMITS),
            user_id=user_id,
            session_key=session_key,
        )
    return Identity(
        "anonymous",
        f"session:{session_key}",
        Limits.from_dict(settings.ROUNDTRIP_ANONYMOUS_LIMITS),
        session_key=session_key,
        address_bucket=f"ip:{client_ip}" if client_ip else None,
    )
