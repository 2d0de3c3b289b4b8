"""Conversations kept per browser session (or per signed-in user), so history goes back in with each turn."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    session_key = models.CharField(max_length=40, db_index=True, blank=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    title = models.CharField(max_length=120)
    system_prompt = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title

    @classmethod
    def owned_by(cls, user_id: int | None, session_key: str) -> models.QuerySet[Conversation]:
        """A signed-in user's conversations, else the browser session's."""
        return (
            cls.objects.filter(user_id=user_id)
            if user_id
            else cls.objects.filter(user__isnull=True, session_key=session_key)
        )

    def history(self) -> list[dict[str, str]]:
        """The messages, oldest first, as the chat API takes them."""
        return [{"role": m.role, "content": m.content} for m in self.messages.order_by("id")]

    def add_exchange(self, question: str, answer: str, request_id: str) -> None:
        Message.objects.bulk_create(
            [
                Message(conversation=self, role="user", content=question, request_id=request_id),
                Message(conversation=self, role="assistant", content=answer, request_id=request_id),
            ]
        )
        self.save(update_fields=["updated_at"])


class Message(models.Model):
    """One message of a kept conversation (a question or an answer), with the request that produced it."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16)
    content = models.TextField()
    request_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
