"""Conversations kept per browser session (or per signed-in user), as trees of messages.

A conversation branches: regenerating an answer adds a sibling answer under the same question, editing a question
adds a sibling question under the same parent, so earlier versions stay reachable. `Conversation.current` is the
message the page shows last; the shown thread is the path from the root down to it.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.db import models

TITLE_LENGTH = 60


class Conversation(models.Model):
    session_key = models.CharField(max_length=40, db_index=True, blank=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    title = models.CharField(max_length=120)
    system_prompt = models.TextField(blank=True)
    current = models.ForeignKey(
        "Message",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The last message of the thread the page shows (the versions picked on the way down).",
    )
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

    def thread(self) -> list[Message]:
        """The shown thread, oldest first: the path from the root to `current`."""
        by_id = {m.pk: m for m in self.messages.all()}
        path: list[Message] = []
        node = by_id.get(self.current_id) if self.current_id is not None else None
        while node is not None:
            path.append(node)
            node = by_id.get(node.parent_id) if node.parent_id is not None else None
        return path[::-1]

    def latest_leaf(self, message: Message) -> Message:
        """The newest message below `message` (itself when it has none): what a picked version leads to."""
        children: dict[int | None, list[Message]] = {}
        for m in self.messages.order_by("id"):
            children.setdefault(m.parent_id, []).append(m)
        leaf = message
        while children.get(leaf.pk):
            leaf = children[leaf.pk][-1]
        return leaf


def title_for(question: str, taken: set[str]) -> str:
    """A title from the first question: its first line, whitespace collapsed, cut at a word; numbered when another
    conversation of the same visitor already has it, so two chats never read the same in the list."""
    line = next((part for part in question.splitlines() if part.strip()), "")
    text = re.sub(r"\s+", " ", line).strip() or "(empty message)"
    if len(text) > TITLE_LENGTH:
        cut = text[:TITLE_LENGTH].rsplit(" ", 1)[0] if " " in text[:TITLE_LENGTH] else text[:TITLE_LENGTH]
        text = cut.rstrip(",.;:") + "…"
    title, n = text, 2
    while title in taken:
        title, n = f"{text} ({n})", n + 1
    return title


class Message(models.Model):
    """One message of a kept conversation (a question or an answer), with the request that produced it and, for an
    answer, how it ended and how fast it came."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children")
    role = models.CharField(max_length=16)
    content = models.TextField()
    request_id = models.CharField(max_length=64, blank=True)
    finish_reason = models.CharField(
        max_length=32, blank=True, help_text="stop, length, stopped (the visitor pressed Stop) or error"
    )
    completion_tokens = models.PositiveIntegerField(default=0)
    ttft_ms = models.FloatField(null=True, blank=True, help_text="The server's time to the first token.")
    tokens_per_s = models.FloatField(null=True, blank=True, help_text="Decode speed, on the server's clock.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
