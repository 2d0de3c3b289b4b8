"""`manage.py serve`: uvicorn on HOST:PORT, printing the URL, with the in-process worker loading at once.

uvicorn parses requests with httptools (llhttp, in C) on uvloop's event loop, and writes each response part straight
to the socket. Daphne, which served the site before, parsed every header line in Python under Twisted and took
0.65 ms more of every request's way to the application and back (a one-chunk answer: 1.35 ms against 0.70 ms, the
same client; docs/performance.md), on the path of every API request's first token. `webapp.transport` keeps the
rules the site's clients rely on: 431 answers for oversized headers, a close frame with a reason for an oversized
WebSocket message."""

from __future__ import annotations

from typing import Any

import uvicorn
from django.core.management.base import BaseCommand, CommandParser

from webapp.transport import WEBSOCKET_MESSAGE_BYTES, HeaderLimitProtocol
from webapp.worker.inprocess import ensure_started


class _Server(uvicorn.Server):
    """uvicorn's server, saying where it listens and starting the in-process worker once its socket is bound."""

    def __init__(self, config: uvicorn.Config, ready: Any) -> None:
        super().__init__(config)
        self.ready = ready

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.ready()


class Command(BaseCommand):
    help = "Serve the site with uvicorn and start the inference worker inside it (default set-up)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args: Any, **opts: Any) -> None:
        from webapp.asgi import application

        host, port = opts["host"], opts["port"]
        shown = f"[{host}]" if ":" in host else host

        def ready() -> None:
            self.stdout.write(f"Roundtrip is running at http://{shown}:{port}/  (Ctrl+C stops it)", ending="\n")
            self.stdout.flush()
            ensure_started()

        config = uvicorn.Config(
            application,
            host=host,
            port=port,
            loop="uvloop",
            http=HeaderLimitProtocol,
            ws="websockets-sansio",
            ws_max_size=WEBSOCKET_MESSAGE_BYTES,
            lifespan="off",
            proxy_headers=False,  # the gateway reads X-Forwarded-For itself, by ROUNDTRIP_TRUSTED_PROXIES
            server_header=False,
            log_config=None,  # Django's logging stays as settings.py sets it
            access_log=False,
            timeout_graceful_shutdown=5,  # open streams get this long to end on Ctrl+C or SIGTERM
            # an idle kept-alive connection stays open past the clients' own pool expiry (httpx's: 5 s), so a client
            # never sends on a connection the server is closing at that moment (uvicorn's default is also 5 s)
            timeout_keep_alive=75,
        )
        _Server(config, ready).run()
