"""Benchmark runs made on the /bench/ page, kept per signed-in user or browser session, with a read-only link."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.db import models

from webapp.benchmark import saved


def _slug() -> str:
    return secrets.token_urlsafe(9)


class BenchResult(models.Model):
    """What the page measured: `settings` (lanes, prompt, runs, concurrency) and `lanes` (every run's browser and
    server clocks), as the page sent them; the permalink shows them again, read-only, to anyone with the link."""

    session_key = models.CharField(max_length=40, db_index=True, blank=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    slug = models.CharField(max_length=16, unique=True, default=_slug)
    title = models.CharField(max_length=120)
    settings = models.JSONField()
    lanes = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.title

    @classmethod
    def owned_by(cls, user_id: int | None, session_key: str) -> models.QuerySet[BenchResult]:
        return (
            cls.objects.filter(user_id=user_id)
            if user_id
            else cls.objects.filter(user__isnull=True, session_key=session_key)
        )

    def rows(self) -> list[dict[str, Any]]:
        """One row per measured request, for CSV export; text that a spreadsheet would run as a formula is escaped."""
        out = []
        for lane in saved.lanes_of(self.lanes):
            for i, run in enumerate(lane["runs"]):
                row = {"lane": lane["name"], "run": i + 1, **{k: run.get(k) for k in CSV_FIELDS}}
                out.append({k: saved.spreadsheet_safe(v) for k, v in row.items()})
        return out


CSV_FIELDS = (
    "status",
    "error",
    "ttft_ms",
    "e2e_ms",
    "tokens",
    "tokens_per_s",
    "mean_itl_ms",
    "server_ttft_ms",
    "server_itl_ms",
    "gateway_ms",
    "gateway_chunk_ms",
    "upstream",
    "request_id",
)
