"""Who may read the metrics: anyone with the bearer token when one is set, else only this machine itself.

"This machine" means a request made here, not one a reverse proxy on this machine passed on: behind a proxy every
visitor arrives from loopback, so a request that carries a proxy's forwarding header (`X-Forwarded-For`,
`Forwarded`, `X-Real-IP`) is never let in without the token, whoever the proxy says it is for; nor is one from an
address named in `ROUNDTRIP_TRUSTED_PROXIES` (a proxy, such as a TCP one, may add no header at all).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Collection, Mapping

PROXY_HEADERS = ("x-forwarded-for", "forwarded", "x-real-ip")


def allowed(
    authorization: str | None,
    client_ip: str | None,
    token: str,
    headers: Mapping[str, str] | None = None,
    proxies: Collection[str] = (),
) -> bool:
    """`headers`: the request's, by lower-case name (only the proxy headers are looked at); `proxies`: the addresses of
    this deployment's proxies."""
    if token:
        return hmac.compare_digest((authorization or "").encode(), f"Bearer {token}".encode())
    if any(name in (headers or {}) for name in PROXY_HEADERS) or client_ip in proxies:
        return False
    try:
        return client_ip is not None and ipaddress.ip_address(client_ip).is_loopback
    except ValueError:
        return False
