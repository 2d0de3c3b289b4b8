"""An upstream's chat chunks relayed to a client (`RelayedChatChunks`), fed as llama-server sends them: under the
gateway's envelope, with the finish held for the end and the usage chunk only when asked for."""

from __future__ import annotations

import json
from typing import Any

from webapp.api.responses import RelayedChatChunks
from webapp.catalog import ModelRoute
from webapp.gateway.lifecycle import Turn

ROUTE = ModelRoute("far", "", ())


def _turn() -> Turn:
    turn = Turn("chat.completions", "127.0.0.1", stream=True)
    turn.ctx.route = ROUTE
    turn.usage.prompt_tokens = 9
    turn.usage.sampled[0] = 2
    return turn


def _upstream(choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    """A chunk as llama-server writes it, its own extras included."""
    return {"choices": choices, "created": 1, "id": "chatcmpl-upstream", "model": "default",
            "system_fingerprint": "b1-abc", "object": "chat.completion.chunk", **more}  # fmt: skip


def _events(parts: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(event.removeprefix(b"data: ")) for part in parts for event in part.split(b"\n\n") if event]


def _stream(include_usage: bool) -> tuple[Turn, list[dict[str, Any]]]:
    turn = _turn()
    writer = RelayedChatChunks(turn, include_usage)
    parts = writer.start()
    parts += writer.feed(
        _upstream([{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}])
    )
    parts += writer.feed(_upstream([{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]))
    parts += writer.feed(_upstream([{"index": 0, "delta": {"content": "lo"}, "finish_reason": "length"}]))
    parts += writer.feed(_upstream([{"index": 0, "delta": {}, "finish_reason": "length"}], timings={"predicted_n": 2}))
    usage = {"completion_tokens": 2, "prompt_tokens": 9, "total_tokens": 11}
    parts += writer.feed(_upstream([], usage=usage))
    parts += writer.end()
    return turn, _events(parts)


def test_each_chunk_goes_under_the_gateways_id_and_model_with_only_its_choices_kept() -> None:
    turn, events = _stream(include_usage=False)
    assert {(e["id"], e["model"], e["object"]) for e in events} == {(turn.request_id, "far", "chat.completion.chunk")}
    assert all("timings" not in e and e["system_fingerprint"] is None for e in events)
    assert [e["choices"][0]["delta"] for e in events[:3]] == [
        {"role": "assistant", "content": None},
        {"content": "Hel"},
        {"content": "lo"},
    ]


def test_the_finish_waits_for_the_end_and_carries_the_gateways_timings() -> None:
    _, events = _stream(include_usage=False)
    assert [e["choices"][0]["finish_reason"] for e in events] == [None, None, None, "length"]  # one finish, last
    assert events[-1]["choices"][0]["delta"] == {} and "gateway_ms" in events[-1]["roundtrip_timings"]


def test_the_usage_chunk_is_the_turns_own_and_only_when_asked_for() -> None:
    _, without = _stream(include_usage=False)
    assert all(e["choices"] for e in without)
    turn, events = _stream(include_usage=True)
    assert events[-1]["choices"] == [] and events[-1]["usage"] == turn.usage.as_openai()
    assert events[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_the_role_chunk_leaves_with_the_first_text_in_one_write() -> None:
    writer = RelayedChatChunks(_turn(), include_usage=False)
    assert writer.feed(_upstream([{"index": 0, "delta": {"role": "assistant", "content": None}}])) == []
    first = writer.feed(_upstream([{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]))
    assert [e["choices"][0]["delta"] for e in _events(first)] == [
        {"role": "assistant", "content": None},
        {"content": "Hel"},
    ]
    assert len(writer.feed(_upstream([{"index": 0, "delta": {"content": "lo"}, "finish_reason": None}]))) == 1
