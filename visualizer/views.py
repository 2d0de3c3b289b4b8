"""The chat page with the live pipeline, the conversation list (htmx partials) and the staff watch page."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from visualizer.models import Conversation
from webapp.catalog import configured_models

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


def _owner(request: HttpRequest) -> tuple[int | None, str]:
    """(user id, session key); the session is created here so the WebSocket shares it."""
    if not request.session.session_key:
        request.session.save()
    user_id = request.user.pk if request.user.is_authenticated else None
    return user_id, request.session.session_key or ""


def chat(request: HttpRequest) -> HttpResponse:
    _owner(request)
    models = [{"id": r.id, "aliases": list(r.aliases)} for r in configured_models()]
    return render(
        request,
        "visualizer/chat.html",
        {"models": models, "system_prompt": DEFAULT_SYSTEM_PROMPT},
    )


def conversation_list(request: HttpRequest) -> HttpResponse:
    conversations = Conversation.owned_by(*_owner(request))[:50]
    return render(request, "visualizer/_conversation_list.html", {"conversations": conversations})


def conversation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    conversation = Conversation.owned_by(*_owner(request)).filter(pk=pk).first()
    if conversation is None:
        raise Http404("No such conversation in this session.")
    return render(
        request, "visualizer/_conversation.html", {"conversation": conversation, "history": conversation.history()}
    )


@staff_member_required
def watch(request: HttpRequest) -> HttpResponse:
    return render(request, "visualizer/watch.html")
