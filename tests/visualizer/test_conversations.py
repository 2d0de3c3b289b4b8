"""Kept conversations as trees: where a turn is filed, versions, deleting a turn, and the page's endpoints for them
(rename, delete, search, pick a version), each scoped to its owner."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from visualizer.conversations import Outcome, Owner, Placement, delete_turn, file_turn, search, show
from visualizer.models import Conversation, Message, title_for

pytestmark = pytest.mark.django_db


def outcome(answer: str, reason: str = "stop", tokens: int = 3) -> Outcome:
    return Outcome(
        request_id="chatcmpl-test",
        answer=answer,
        finish_reason=reason,
        completion_tokens=tokens,
        ttft_ms=12.5,
        tokens_per_s=140.0,
    )


@pytest.fixture
def owner() -> Owner:
    return Owner(None, "session-a")


def thread(conversation_id: int) -> list[tuple[str, str]]:
    conversation = Conversation.objects.get(pk=conversation_id)
    return [(m.role, m.content) for m in conversation.thread()]


def test_a_first_turn_starts_a_conversation_titled_by_its_question(owner: Owner) -> None:
    kept = file_turn(owner, Placement(), "What's the capital of India?", "be brief", outcome("New Delhi."))
    conversation = Conversation.objects.get(pk=kept["conversation"])
    assert conversation.title == "What's the capital of India?" and conversation.system_prompt == "be brief"
    assert thread(conversation.pk) == [("user", "What's the capital of India?"), ("assistant", "New Delhi.")]
    assert kept["answer"]["finish_reason"] == "stop" and kept["answer"]["ttft_ms"] == 12.5
    assert kept["current"] == kept["answer"]["id"] and kept["question"]["content"] == "What's the capital of India?"


def test_titles_tell_two_chats_apart() -> None:
    assert title_for("  hello\n\nworld  ", set()) == "hello"
    assert title_for("hello", {"hello"}) == "hello (2)"
    assert title_for("hello", {"hello", "hello (2)"}) == "hello (3)"
    long = title_for("word " * 40, set())
    assert long.endswith("…") and len(long) <= 61 and not long.endswith(" …")
    assert title_for("", set()) == "(empty message)"


def test_a_new_question_follows_the_thread(owner: Owner) -> None:
    first = file_turn(owner, Placement(), "one", "", outcome("1"))
    second = file_turn(owner, Placement(first["conversation"], parent=first["answer"]["id"]), "two", "", outcome("2"))
    assert second["conversation"] == first["conversation"]
    assert thread(first["conversation"]) == [("user", "one"), ("assistant", "1"), ("user", "two"), ("assistant", "2")]


def test_regenerate_keeps_the_earlier_answer_as_a_version(owner: Owner) -> None:
    first = file_turn(owner, Placement(), "one", "", outcome("1"))
    question = first["question"]["id"]
    again = file_turn(owner, Placement(first["conversation"], answer_to=question), "one", "", outcome("uno"))
    assert again["question"]["id"] == question
    assert thread(first["conversation"]) == [("user", "one"), ("assistant", "uno")]
    answers = Message.objects.filter(parent_id=question).order_by("id")
    assert [a.content for a in answers] == ["1", "uno"]
    show(Conversation.objects.get(pk=first["conversation"]), answers[0])
    assert thread(first["conversation"]) == [("user", "one"), ("assistant", "1")]


def test_editing_a_question_branches_and_picking_a_version_follows_its_newest_line(owner: Owner) -> None:
    first = file_turn(owner, Placement(), "one", "", outcome("1"))
    cid = first["conversation"]
    file_turn(owner, Placement(cid, parent=first["answer"]["id"]), "two", "", outcome("2"))
    edited = file_turn(owner, Placement(cid, parent=None), "ONE", "", outcome("I"))  # the first question, edited
    assert thread(cid) == [("user", "ONE"), ("assistant", "I")]
    conversation = Conversation.objects.get(pk=cid)
    show(conversation, Message.objects.get(pk=first["question"]["id"]))
    assert thread(cid) == [("user", "one"), ("assistant", "1"), ("user", "two"), ("assistant", "2")]
    assert edited["question"]["parent"] is None


def test_continue_extends_the_same_answer(owner: Owner) -> None:
    first = file_turn(owner, Placement(), "count", "", outcome("1, 2,", "length", 4))
    cid, answer = first["conversation"], first["answer"]["id"]
    more = file_turn(owner, Placement(cid, extend=answer), "count", "", outcome("1, 2, 3.", "stop", 3))
    assert more["answer"]["id"] == answer and more["question"]["id"] == first["question"]["id"]
    kept = Message.objects.get(pk=answer)
    assert (kept.content, kept.finish_reason, kept.completion_tokens) == ("1, 2, 3.", "stop", 7)
    assert thread(cid) == [("user", "count"), ("assistant", "1, 2, 3.")]


def test_a_stopped_answer_is_kept_even_empty(owner: Owner) -> None:
    kept = file_turn(owner, Placement(), "long one", "", outcome("", "stopped", 0))
    assert kept["answer"]["content"] == "" and kept["answer"]["finish_reason"] == "stopped"


def test_a_placement_that_no_longer_resolves_files_after_the_thread(owner: Owner) -> None:
    first = file_turn(owner, Placement(), "one", "", outcome("1"))
    cid = first["conversation"]
    late = file_turn(owner, Placement(cid, parent=99999), "two", "", outcome("2"))
    assert late["conversation"] == cid and thread(cid)[-2:] == [("user", "two"), ("assistant", "2")]
    elsewhere = file_turn(owner, Placement(99999), "three", "", outcome("3"))
    assert elsewhere["conversation"] != cid


def test_deleting_a_turn_keeps_the_rest_of_the_thread(owner: Owner) -> None:
    first = file_turn(owner, Placement(), "one", "", outcome("1"))
    cid = first["conversation"]
    second = file_turn(owner, Placement(cid, parent=first["answer"]["id"]), "two", "", outcome("2"))
    file_turn(owner, Placement(cid, parent=second["answer"]["id"]), "three", "", outcome("3"))
    conversation = Conversation.objects.get(pk=cid)
    delete_turn(conversation, Message.objects.get(pk=second["answer"]["id"]))  # an answer: its exchange goes
    assert thread(cid) == [("user", "one"), ("assistant", "1"), ("user", "three"), ("assistant", "3")]
    delete_turn(conversation, Message.objects.get(pk=first["question"]["id"]))
    assert thread(cid) == [("user", "three"), ("assistant", "3")]


def test_deleting_the_shown_last_turn_shows_the_one_before(owner: Owner) -> None:
    first = file_turn(owner, Placement(), "one", "", outcome("1"))
    cid = first["conversation"]
    second = file_turn(owner, Placement(cid, parent=first["answer"]["id"]), "two", "", outcome("2"))
    delete_turn(Conversation.objects.get(pk=cid), Message.objects.get(pk=second["question"]["id"]))
    assert thread(cid) == [("user", "one"), ("assistant", "1")]


def test_search_finds_titles_and_message_text_of_the_owner_only(owner: Owner) -> None:
    file_turn(owner, Placement(), "pancakes please", "", outcome("flour and eggs"))
    file_turn(owner, Placement(), "capital of India", "", outcome("New Delhi"))
    file_turn(Owner(None, "session-b"), Placement(), "pancakes too", "", outcome("milk"))
    assert [c.title for c in search(owner, "EGGS")] == ["pancakes please"]
    assert [c.title for c in search(owner, "pancake")] == ["pancakes please"]
    assert search(owner, "  ").count() == 2


# --- the page's endpoints ---------------------------------------------------------------------------------------


@pytest.fixture
def visitor(client: Client) -> tuple[Client, Owner]:
    client.get("/")  # the page starts the session the socket shares
    return client, Owner(None, client.session.session_key or "")


def patch(client: Client, url: str, body: Any, method: str = "patch") -> Any:
    return getattr(client, method)(
        url, data=json.dumps(body) if not isinstance(body, str) else body, content_type="application/json"
    )


def test_a_conversation_reads_back_as_its_whole_tree(visitor: tuple[Client, Owner]) -> None:
    client, owner = visitor
    first = file_turn(owner, Placement(), "one", "sys", outcome("1"))
    file_turn(owner, Placement(first["conversation"], answer_to=first["question"]["id"]), "one", "", outcome("uno"))
    data = client.get(f"/conversations/{first['conversation']}/").json()
    assert data["system_prompt"] == "sys" and len(data["messages"]) == 3
    assert data["current"] == data["messages"][-1]["id"] and data["messages"][-1]["tokens_per_s"] == 140.0


def test_rename_delete_and_pick_a_version(visitor: tuple[Client, Owner]) -> None:
    client, owner = visitor
    first = file_turn(owner, Placement(), "one", "", outcome("1"))
    cid = first["conversation"]
    file_turn(owner, Placement(cid, answer_to=first["question"]["id"]), "one", "", outcome("uno"))
    assert patch(client, f"/conversations/{cid}/", {"title": "  Numbers  "}).json()["title"] == "Numbers"
    picked = patch(client, f"/conversations/{cid}/current", {"message": first["answer"]["id"]}, "put").json()
    assert picked["current"] == first["answer"]["id"]
    assert client.delete(f"/conversations/{cid}/messages/{first['question']['id']}/").json()["messages"] == []
    assert client.delete(f"/conversations/{cid}/").status_code == 204
    assert not Conversation.objects.filter(pk=cid).exists()


@pytest.mark.parametrize(
    ("body", "param"),
    [({"title": ""}, "title"), ({"title": "x" * 121}, "title"), ({"name": "x"}, "title"), ("{", None), ("[]", None)],
)
def test_a_bad_rename_is_a_400_naming_the_field(visitor: tuple[Client, Owner], body: Any, param: str | None) -> None:
    client, owner = visitor
    cid = file_turn(owner, Placement(), "one", "", outcome("1"))["conversation"]
    response = patch(client, f"/conversations/{cid}/", body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert Conversation.objects.get(pk=cid).title == "one"


def test_another_visitors_conversation_is_not_there(visitor: tuple[Client, Owner]) -> None:
    client, _ = visitor
    theirs = file_turn(Owner(None, "someone-else"), Placement(), "mine", "", outcome("private"))
    cid, answer = theirs["conversation"], theirs["answer"]["id"]
    assert client.get(f"/conversations/{cid}/").status_code == 404
    assert patch(client, f"/conversations/{cid}/", {"title": "hijacked"}).status_code == 404
    assert client.delete(f"/conversations/{cid}/").status_code == 404
    assert client.delete(f"/conversations/{cid}/messages/{answer}/").status_code == 404
    assert Conversation.objects.get(pk=cid).title == "mine"


def test_the_list_searches_and_says_when_nothing_matches(visitor: tuple[Client, Owner]) -> None:
    client, owner = visitor
    file_turn(owner, Placement(), "pancakes please", "", outcome("flour and eggs"))
    assert "pancakes please" in client.get("/conversations/?q=eggs").content.decode()
    assert "No conversation mentions “kiwi”" in client.get("/conversations/?q=kiwi").content.decode()
