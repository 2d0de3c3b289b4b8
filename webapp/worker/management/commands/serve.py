"""`manage.py serve`: Daphne on HOST:PORT, printing the URL, with the in-process worker loading at once."""

from __future__ import annotations

from typing import Any

from daphne.server import Server
from django.core.management.base import BaseCommand, CommandParser

from webapp import transport
from webapp.worker.inprocess import ensure_started


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
