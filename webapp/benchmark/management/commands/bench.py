"""`manage.py bench`: the latency benchmark (`webapp.benchmark.cli`), by default against this site's API."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand

from webapp.benchmark.cli import main


class Command(BaseCommand):
    help = "Measure TTFT, inter-token latency and throughput of an OpenAI-compatible server (see --help)."

    def run_from_argv(self, argv: list[str]) -> None:
        """The benchmark has its own argument parser; everything after `bench` goes to it."""
        sys.exit(main(argv[2:]))
