"""`manage.py serve`: Daphne on HOST:PORT, printing the URL, with the in-process worker loading at once.

Daphne runs Twisted on an asyncio event loop, which its module makes as it is imported: uvloop's loop, chosen here
first. Every request and streamed chunk passes through the loop; on uvloop the gateway spent about a tenth less CPU
time per streamed token in front of another server (benchmarks/bench_gateway.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import uvloop

asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # before Daphne's module makes its loop

from daphne.server import Server  # noqa: E402
from django.core.management.base import BaseCommand, CommandParser  # noqa: E402

from webapp import transport  # noqa: E402
from webapp.worker.inprocess import ensure_started  # noqa: E402


class Command(BaseCommand):
    help = "Serve the site with Daphne and start the inference worker inside it (default set-up)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args: Any, **opts: Any) -> None:
        from webapp.asgi import application

        host, port = opts["host"], opts["port"]
        shown = f"[{host}]" if ":" in host else host

        def ready() -> None:
            transport.close_oversized_sockets_cleanly(server.ws_factory)
            self.stdout.write(f"Roundtrip is running at http://{shown}:{port}/  (Ctrl+C stops it)", ending="\n")
            self.stdout.flush()
            ensure_started()

        transport.install()
        server = Server(application, endpoints=[f"tcp:port={port}:interface={host}"], ready_callable=ready, verbosity=0)
        server.run()
