from django.contrib import admin
from django.http import HttpRequest

from webapp.usage.models import UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    """Read-only: usage records are evidence, not something to edit."""

    list_display = [
        "created_at",
        "request_id",
        "api_key",
        "user",
        "end_user",
        "endpoint",
        "model",
        "status",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "cost_usd",
        "ttft_ms",
        "total_ms",
        "client_ip",
    ]
    list_filter = ["status", "finish_reason", "model", "stream", "api_key"]
    search_fields = ["request_id", "end_user", "api_key__name", "api_key__prefix"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
