"""Who is asking, by address: the peer, or behind a trusted proxy the address the proxy saw.

`X-Forwarded-For` is believed only from the proxies named in `ROUNDTRIP_TRUSTED_PROXIES`
(anyone else could write any address there and get a fresh rate-limit bucket per request); then
the client is the right-most address in it that is not itself a trusted proxy.
"""

from __future__ import annotations

from django.conf import settings


def client_ip(peer: str | None, forwarded_for: str | None) -> str | None:
    trusted = set(settings.ROUNDTRIP_TRUSTED_PROXIES)
    if not peer or peer not in trusted or not forwarded_for:
        return peer or None
    for address in reversed([a.strip() for a in forwarded_for.split(",") if a.strip()]):
        if address not in trusted:
            return address
    return peer
