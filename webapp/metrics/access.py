"""Who may read the metrics: anyone with the bearer token when one is set, else only this machine."""

from __future__ import annotations

import hmac
import ipaddress


def allowed(authorization: str | None, client_ip: str | None, token: str) -> bool:
    if token:
        return hmac.compare_digest((authorization or "").encode(), f"Bearer {token}".encode())
    try:
        return client_ip is not None and ipaddress.ip_address(client_ip).is_loopback
    except ValueError:
        return False
