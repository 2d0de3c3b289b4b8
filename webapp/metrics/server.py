"""A worker process's own metrics endpoint (`runinferenceworker --metrics-port`), with the same access rule as
`/metrics`.

A worker of its own has no web server; Prometheus scrapes it here, beside each web
process's `/metrics` (see the README on scraping).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from webapp.metrics.access import allowed


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds: not worth a log line
        pass


def start(host: str, port: int, token: str, proxies: Collection[str] = ()) -> WSGIServer:
    """Serve the process's metrics on host:port from a daemon thread; returns the server (its port is the real one)."""
    metrics_app = make_wsgi_app()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        headers = {
            key[5:].replace("_", "-").lower(): str(value) for key, value in environ.items() if key.startswith("HTTP_")
        }
        if not allowed(environ.get("HTTP_AUTHORIZATION"), environ.get("REMOTE_ADDR"), token, headers, proxies):
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [b"metrics need a valid bearer token or a loopback address\n"]
        return metrics_app(environ, start_response)

    server = make_server(host, port, app, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="roundtrip-metrics", daemon=True).start()
    return server
