"""What happens to a kept conversation: a finished turn is filed where the page said (a new exchange, another version
of an answer, or more of one), a version is picked, a turn deleted; and the shape the page reads them in.

The socket (`visualizer.runs`) files turns; the conversation views (`visualizer.views`) do the rest. Everything is
scoped to one owner (a signed-in user, else the browser session), so one visitor never reaches another's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet

from visualizer.models import Conversation, Message, title_for


@dataclass(frozen=True)
class Owner:
    user_id: int | None
    session_key: str

    def conversations(self) -> QuerySet[Conversation]:
        return Conversation.owned_by(self.user_id, self.session_key)


@dataclass(frozen=True)
class Placement:
    """Where a turn's answer goes, as the page's chat frame says. With neither `answer_to` nor `extend` it is a new
    exchange: the question follows `parent` (None: the conversation's start) and the answer follows the question."""

    conversation: int | None = None
    parent: int | None = None
    answer_to: int | None = None  # regenerate or branch: another answer to this question
    extend: int | None = None  # continue: this answer goes on


@dataclass(frozen=True)
class Outcome:
    """How a turn ended: the answer as it now reads (for a branch or a continuation, with the part it went on from),
    and its finish reason and speed."""

    request_id: str
    answer: str
    finish_reason: str
    completion_tokens: int
    ttft_ms: float | None
    tokens_per_s: float | None


def message_json(message: Message) -> dict[str, Any]:
    return {
        "id": message.pk,
        "parent": message.parent_id,
        "role": message.role,
        "content": message.content,
        "finish_reason": message.finish_reason,
        "completion_tokens": message.completion_tokens,
        "ttft_ms": message.ttft_ms,
        "tokens_per_s": message.tokens_per_s,
    }


def conversation_json(conversation: Conversation) -> dict[str, Any]:
    """The whole tree, so the page can show any version without asking again."""
    return {
        "id": conversation.pk,
        "title": conversation.title,
        "system_prompt": conversation.system_prompt,
        "current": conversation.current_id,
        "messages": [message_json(m) for m in conversation.messages.order_by("id")],
    }


def search(owner: Owner, text: str) -> QuerySet[Conversation]:
    """The owner's conversations whose title or any message contains `text` (all of them for empty text)."""
    found = owner.conversations()
    text = text.strip()
    if text:
        found = found.filter(Q(title__icontains=text) | Q(messages__content__icontains=text)).distinct()
    return found


@transaction.atomic
def file_turn(owner: Owner, placement: Placement, question: str, system: str, outcome: Outcome) -> dict[str, Any]:
    """Keep a finished (or stopped) turn where `placement` says; what the page needs to show it: the conversation,
    the question and the answer as stored, and the message the thread now ends at. A placement that no longer resolves
    (deleted in another tab) files a new exchange after the shown thread, or in a new conversation."""
    conversation = owner.conversations().filter(pk=placement.conversation).first() if placement.conversation else None
    if conversation is None:
        conversation = Conversation.objects.create(
            user_id=owner.user_id,
            session_key=owner.session_key,
            title=title_for(question, set(owner.conversations().values_list("title", flat=True))),
            system_prompt=system,
        )
    messages = conversation.messages
    stats = {
        "content": outcome.answer,
        "request_id": outcome.request_id,
        "finish_reason": outcome.finish_reason,
        "completion_tokens": outcome.completion_tokens,
        "ttft_ms": outcome.ttft_ms,
        "tokens_per_s": outcome.tokens_per_s,
    }
    extended = messages.filter(pk=placement.extend, role="assistant").first() if placement.extend else None
    asked = messages.filter(pk=placement.answer_to, role="user").first() if placement.answer_to else None
    if extended is not None:
        stats["completion_tokens"] = extended.completion_tokens + outcome.completion_tokens
        for name, value in stats.items():
            setattr(extended, name, value)
        extended.save()
        answer, asked = extended, extended.parent
    else:
        if asked is None:
            parent = messages.filter(pk=placement.parent).first() if placement.parent else None
            if placement.parent and parent is None:
                parent = conversation.current
            asked = Message.objects.create(
                conversation=conversation, parent=parent, role="user", content=question, request_id=outcome.request_id
            )
        answer = Message.objects.create(conversation=conversation, parent=asked, role="assistant", **stats)
    conversation.current = conversation.latest_leaf(answer)
    conversation.save(update_fields=["current", "updated_at"])
    return {
        "conversation": conversation.pk,
        "question": message_json(asked) if asked is not None else None,
        "answer": message_json(answer),
        "current": conversation.current_id,
    }


def show(conversation: Conversation, message: Message) -> None:
    """Pick a version: the thread now runs through `message`, down to its newest descendant."""
    conversation.current = conversation.latest_leaf(message)
    conversation.save(update_fields=["current", "updated_at"])


@transaction.atomic
def delete_turn(conversation: Conversation, message: Message) -> None:
    """Delete one exchange: the question (or the question of the answer given) with its answers. What followed the
    shown answer moves up to the question's parent, so the rest of the thread stays; other versions of the answer
    go with it."""
    question = message if message.role == "user" else message.parent
    if question is None:  # an answer without a question: only the answer
        question = message
    thread = {m.pk for m in conversation.thread()}
    answers = list(question.children.order_by("id"))
    kept = next((a for a in answers if a.pk in thread), answers[-1] if answers else None)
    if kept is not None:
        kept.children.update(parent=question.parent)
    parent = question.parent
    shown_gone = conversation.current_id in {question.pk, *(a.pk for a in answers)}
    question.delete()
    conversation.refresh_from_db()
    if shown_gone or conversation.current is None:
        if parent is not None:
            conversation.current = conversation.latest_leaf(parent)
        else:
            newest = conversation.messages.order_by("-id").first()
            conversation.current = conversation.latest_leaf(newest) if newest is not None else None
    conversation.save(update_fields=["current", "updated_at"])


def rename(conversation: Conversation, title: str) -> None:
    conversation.title = title
    conversation.save(update_fields=["title", "updated_at"])
