"""Responses API answers kept so a conversation can continue by id (`previous_response_id`)."""

from __future__ import annotations

from django.db import models


class StoredResponse(models.Model):
    """One stored response: the object as it was returned, and the conversation up to and including its output as
    chat messages (what a later request with `previous_response_id` continues). Only its owner reads it."""

    id = models.CharField(max_length=64, primary_key=True)
    owner = models.CharField(max_length=128, db_index=True, help_text="The rate-limit bucket: key:<id>, user:<id>, …")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    expires_at = models.DateTimeField(db_index=True)
    model = models.CharField(max_length=100)
    body = models.JSONField(help_text="The response object as returned.")
    conversation = models.JSONField(help_text="Chat messages: earlier turns, this input, this output.")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.id
