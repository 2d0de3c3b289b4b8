"""`manage.py runinferenceworker`: an inference worker as its own process (with the Redis channel layer)."""

from __future__ import annotations

import asyncio
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.catalog import local_models
from webapp.metrics.server import start as start_metrics
from webapp.worker.service import serve


class Command(BaseCommand):
    help = "Load the configured models and serve their work channels on the channel layer."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", action="append", help="serve only this model id (repeatable)")
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=settings.ROUNDTRIP_WORKER_METRICS_PORT,
            help="serve this worker's Prometheus metrics on this port (0: off; default ROUNDTRIP_WORKER_METRICS_PORT)",
        )
        parser.add_argument("--metrics-host", default="127.0.0.1", help="address for the metrics port")

    def handle(self, *args: Any, **opts: Any) -> None:
        if settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith("InMemoryChannelLayer"):
            raise CommandError(
                "the in-memory channel layer cannot reach other processes: set REDIS_URL, or just run the site (the "
                "worker starts inside it)"
            )
        routes = [r for r in local_models() if not opts["model"] or r.id in opts["model"]]
        if not routes:
            raise CommandError(f"no configured model matches {opts['model']}")
        self.stderr.write(f"inference worker for {', '.join(r.id for r in routes)}")
        if opts["metrics_port"]:
            server = start_metrics(
                opts["metrics_host"],
                opts["metrics_port"],
                settings.ROUNDTRIP_METRICS_TOKEN,
                settings.ROUNDTRIP_TRUSTED_PROXIES,
            )
            self.stderr.write(f"metrics at http://{opts['metrics_host']}:{server.server_port}/metrics")
        asyncio.run(serve(routes))
