"""Who is asking: an API key from the Authorization header, else the browser's Django session."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from webapp.gateway.errors import GatewayError
from webapp.gateway.limits import Limits
from webapp.keys.models import ApiKey, KeyRejected


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


def identify_key(authorization: str | None) -> Identity:
    """The identity behind `Authorization: Bearer <key>`; 401 for a missing, unknown, revoked or expired key."""
    if not authorization:
        raise _unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer rt-...'.")
    scheme, _, raw = authorization.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise _unauthorized("Malformed Authorization header; expected 'Bearer <API key>'.")
    try:
        key = ApiKey.authenticate(raw.strip())
    except KeyRejected as exc:
        raise _unauthorized(exc.reason) from None
    key.touch()
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
