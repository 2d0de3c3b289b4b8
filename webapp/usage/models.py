"""One usage record per API or chat request, written whatever happened to it."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class UsageRecord(models.Model):
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    request_id = models.CharField(max_length=64, db_index=True)
    api_key = models.ForeignKey(
        "keys.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="usage_records"
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    session_key = models.CharField(max_length=40, blank=True)
    endpoint = models.CharField(max_length=64)
    model = models.CharField(max_length=100, blank=True)
    stream = models.BooleanField(default=False)
    status = models.PositiveSmallIntegerField()
    error_code = models.CharField(max_length=64, blank=True)
    finish_reason = models.CharField(
        max_length=32, blank=True, help_text="stop, length, tool_calls, cancelled (client left) or error"
    )
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(
        default=0, help_text="Prompt tokens whose keys and values came from the prefix cache."
    )
    worker = models.CharField(max_length=100, blank=True, help_text="The inference worker that served the request.")
    cost_usd = models.FloatField(
        default=0, help_text="US dollars billed: the tokens at the model's prices per million (ROUNDTRIP_MODELS)."
    )
    ttft_ms = models.FloatField(null=True, blank=True)
    total_ms = models.FloatField(null=True, blank=True)
    client_ip = models.GenericIPAddressField(null=True, blank=True)
    end_user = models.CharField(
        max_length=256, blank=True, help_text="The client's own id for its end user (the request's `user` field)."
    )
    prompt_text = models.TextField(blank=True, help_text="Only kept when ROUNDTRIP_STORE_PROMPTS is on.")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.request_id} {self.endpoint} {self.status}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
