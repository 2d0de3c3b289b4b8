"""API keys: shown once at creation, stored only as a SHA-256 hash with a short visible prefix.

The keys are 256-bit random strings, so a fast hash is enough: there is nothing to
brute-force, and lookups by hash stay a single indexed query.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

KEY_PREFIX = "rt-"
VISIBLE_CHARS = 10  # "rt-" and the first 7 random characters identify a key in lists
TOUCH_INTERVAL = timedelta(minutes=1)  # how stale `last_used_at` may be


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class KeyRejected(Exception):
    """The presented key cannot be used; `reason` says why in words a client can act on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ApiKey(models.Model):
    BUDGET_PERIODS = [("day", "per day"), ("month", "per month")]

    name = models.CharField(max_length=100)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="api_keys"
    )
    prefix = models.CharField(max_length=16, editable=False, db_index=True)
    hashed_key = models.CharField(max_length=64, unique=True, editable=False)
    is_active = models.BooleanField(default=True, help_text="Unticked: revoked; every request with it gets 401.")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    allowed_models = models.JSONField(default=list, blank=True, help_text="Model ids this key may use; empty: all.")
    requests_per_minute = models.PositiveIntegerField(default=60, help_text="0: unlimited")
    tokens_per_minute = models.PositiveIntegerField(default=100_000, help_text="0: unlimited")
    concurrent_streams = models.PositiveIntegerField(default=4, help_text="0: unlimited")
    token_budget = models.PositiveIntegerField(default=0, help_text="Tokens per budget period; 0: unlimited")
    budget_period = models.CharField(max_length=5, choices=BUDGET_PERIODS, default="day")
    spend_budget = models.FloatField(
        default=0, help_text="US dollars per budget period, at the models' prices; 0: unlimited"
    )

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def create_key(cls, name: str, **fields: Any) -> tuple[ApiKey, str]:
        """Create a key; returns (record, raw key). The raw key is not stored and cannot be shown again."""
        key = cls(name=name, **fields)
        raw = key.assign_new_secret()
        key.save()
        return key, raw

    def assign_new_secret(self) -> str:
        """Give this (unsaved) key a fresh secret; returns the raw key, which only its hash remembers."""
        raw = KEY_PREFIX + secrets.token_urlsafe(32)
        self.prefix, self.hashed_key = raw[:VISIBLE_CHARS], hash_key(raw)
        return raw

    @classmethod
    def authenticate(cls, raw: str) -> ApiKey:
        """The active, unexpired key matching `raw`; KeyRejected otherwise."""
        key = cls.objects.filter(hashed_key=hash_key(raw)).first()
        if key is None:
            raise KeyRejected("Incorrect API key provided.")
        if not key.is_active:
            raise KeyRejected("This API key has been revoked.")
        if key.expires_at is not None and key.expires_at <= timezone.now():
            raise KeyRejected("This API key has expired.")
        return key

    def revoke(self) -> None:
        self.is_active = False
        self.revoked_at = self.revoked_at or timezone.now()
        self.save(update_fields=["is_active", "revoked_at"])

    def allows_model(self, model_id: str) -> bool:
        return not self.allowed_models or model_id in self.allowed_models

    def touch(self, when: datetime | None = None) -> None:
        """Record use, to the minute, without loading or saving the rest of the row: a write on every request would
        put each arrival behind the database's write lock (and, on SQLite, a sync to disk) for a column shown in
        minutes."""
        when = when or timezone.now()
        if self.last_used_at is not None and timedelta(0) <= when - self.last_used_at < TOUCH_INTERVAL:
            return
        ApiKey.objects.filter(pk=self.pk).update(last_used_at=when)
        self.last_used_at = when
