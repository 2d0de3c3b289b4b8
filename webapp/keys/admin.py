"""Keys in Django admin: create one (its secret shown once), revoke in one click, see its usage."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet, Sum
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from webapp.keys.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "prefix",
        "owner",
        "is_active",
        "expires_at",
        "last_used_at",
        "tokens_used",
        "spent",
        "usage_link",
    ]
    list_filter = ["is_active", "budget_period"]
    search_fields = ["name", "prefix", "owner__username"]
    readonly_fields = ["prefix", "created_at", "revoked_at", "last_used_at"]
    actions = ["revoke_keys"]

    @admin.action(description="Revoke selected keys")
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset.filter(is_active=True):
            key.revoke()
        self.message_user(request, f"Revoked {queryset.count()} key(s).", messages.SUCCESS)

    @admin.display(description="tokens used")
    def tokens_used(self, key: ApiKey) -> int:
        totals = key.usage_records.aggregate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
        return (totals["p"] or 0) + (totals["c"] or 0)

    @admin.display(description="spent (USD)")
    def spent(self, key: ApiKey) -> float:
        return round(key.usage_records.aggregate(s=Sum("cost_usd"))["s"] or 0.0, 6)

    @admin.display(description="usage")
    def usage_link(self, key: ApiKey) -> str:
        url = reverse("admin:usage_usagerecord_changelist") + f"?api_key__id__exact={key.pk}"
        return format_html('<a href="{}">requests</a>', url)

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        """A new key gets its secret here; the admin sees it once, in the success message."""
        if change:
            if not obj.is_active and obj.revoked_at is None:
                obj.revoked_at = timezone.now()
            super().save_model(request, obj, form, change)
            return
        raw = obj.assign_new_secret()
        super().save_model(request, obj, form, change)
        self.message_user(request, f"Copy this key now, it will not be shown again: {raw}", messages.WARNING)
