"""The chat page with the live pipeline, its conversations (the list as an htmx partial, a conversation as JSON, and
rename, delete, pick a version, delete a turn) and the staff watch page."""

from __future__ import annotations

from typing import Annotated

from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods
from pydantic import Field, StringConstraints

from visualizer import conversations
from visualizer.conversations import Owner
from visualizer.frames import MessageId
from visualizer.models import Conversation, Message
from webapp.api.protocol import StrictModel, parse
from webapp.api.responses import error_response
from webapp.catalog import configured_models
from webapp.gateway.errors import GatewayError, bad_request
from webapp.gateway.json_input import BadJSON, loads_object

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
# The page's sampling default, picked by trying SmolLM2-135M-Instruct (benchmarks/pick_chat_sampling.py, docs/page.md):
# the facts most often right with little repetition, answers that end and still vary. Greedy is one click away.
CHAT_SAMPLING = {"temperature": 0.2, "top_p": 0.9, "top_k": 0, "min_p": 0, "repetition_penalty": 1.1}
LISTED = 100  # conversations in the list (the newest); search reaches the rest


class Rename(StrictModel):
    title: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=120)]


class Show(StrictModel):
    message: Annotated[MessageId, Field(description="the version to show: the thread runs through it")]


def _owner(request: HttpRequest) -> Owner:
    """The visitor; the session is created here so the WebSocket shares it."""
    if not request.session.session_key:
        request.session.save()
    user_id = request.user.pk if request.user.is_authenticated else None
    return Owner(user_id, request.session.session_key or "")


def _conversation(request: HttpRequest, pk: int) -> Conversation:
    conversation = _owner(request).conversations().filter(pk=pk).first()
    if conversation is None:
        raise Http404("No such conversation in this session.")
    return conversation


def chat(request: HttpRequest) -> HttpResponse:
    _owner(request)
    models = [{"id": r.id, "aliases": list(r.aliases)} for r in configured_models()]
    return render(
        request,
        "visualizer/chat.html",
        {"models": models, "system_prompt": DEFAULT_SYSTEM_PROMPT, "sampling": CHAT_SAMPLING},
    )


def compare(request: HttpRequest) -> HttpResponse:
    """Two models side by side on one text: their tokens and their next-token distributions (asked over the page's
    socket)."""
    models = [r.id for r in configured_models()]
    return render(request, "visualizer/compare.html", {"models": models, "second": models[1 % len(models)]})


def conversation_list(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "")[:200]
    found = conversations.search(_owner(request), query)[:LISTED]
    return render(request, "visualizer/_conversation_list.html", {"conversations": found, "query": query})


@require_http_methods(["GET", "PATCH", "DELETE"])
def conversation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the whole tree; PATCH {"title"}: rename; DELETE: gone, with its messages."""
    conversation = _conversation(request, pk)
    if request.method == "DELETE":
        conversation.delete()
        return HttpResponse(status=204)
    if request.method == "PATCH":
        try:
            conversations.rename(conversation, parse(Rename, loads_object(request.body.decode())).title)
        except (GatewayError, BadJSON, UnicodeDecodeError) as exc:
            return _bad(exc)
    return JsonResponse(conversations.conversation_json(conversation))


@require_http_methods(["PUT"])
def conversation_current(request: HttpRequest, pk: int) -> HttpResponse:
    """PUT {"message"}: show that version (the thread runs through it, down to its newest message)."""
    conversation = _conversation(request, pk)
    try:
        picked = parse(Show, loads_object(request.body.decode())).message
    except (GatewayError, BadJSON, UnicodeDecodeError) as exc:
        return _bad(exc)
    message = conversation.messages.filter(pk=picked).first()
    if message is None:
        raise Http404("No such message in this conversation.")
    conversations.show(conversation, message)
    return JsonResponse(conversations.conversation_json(conversation))


@require_http_methods(["DELETE"])
def conversation_message(request: HttpRequest, pk: int, message_id: int) -> HttpResponse:
    """DELETE: the exchange this message belongs to (the question with its answers); the rest of the thread stays."""
    conversation = _conversation(request, pk)
    message: Message | None = conversation.messages.filter(pk=message_id).first()
    if message is None:
        raise Http404("No such message in this conversation.")
    conversations.delete_turn(conversation, message)
    return JsonResponse(conversations.conversation_json(conversation))


def _bad(exc: Exception) -> JsonResponse:
    if isinstance(exc, GatewayError):
        return error_response(exc)
    message = exc.message if isinstance(exc, BadJSON) else "The body must be UTF-8 JSON."
    return error_response(bad_request(message, code="invalid_json"))


@staff_member_required
def watch(request: HttpRequest) -> HttpResponse:
    return render(request, "visualizer/watch.html")
