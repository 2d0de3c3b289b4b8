"""An upstream's streamed chunks read as the wire's trace events (`webapp.gateway.upstream.chunks`)."""

from __future__ import annotations

import json
import math
from typing import Any

from webapp.gateway.upstream.chunks import MAX_SERVER_TIMINGS, ChunkReader
from webapp.worker import wire


def _chat(content: str | None = None, index: int = 0, finish: str | None = None, **more: Any) -> dict[str, Any]:
    delta = {"content": content} if content is not None else {}
    return {"choices": [{"index": index, "delta": delta | more.pop("delta", {}), "finish_reason": finish, **more}]}


def test_each_reported_token_is_a_sampled_event_with_its_alternatives_as_candidates() -> None:
    reader = ChunkReader(n=1, sent=10.0)
    top = [{"token": " Paris", "logprob": -0.1, "id": 7}, {"token": " Lyon", "logprob": -2.5}]
    logprobs = {"content": [{"token": " Paris", "logprob": -0.1, "id": 7, "top_logprobs": top}]}
    events = reader.read(_chat(" Paris", logprobs=logprobs), 10.5)
    (_, sampled), (_, delta) = events
    assert isinstance(sampled, wire.Sampled) and isinstance(delta, wire.TextDelta)
    assert (sampled.token, sampled.token_id, sampled.rank, sampled.bytes) == (" Paris", 7, 0, list(b" Paris"))
    assert sampled.detail is not None and [c.token for c in sampled.detail.candidates] == [" Paris", " Lyon"]
    assert math.isclose(sampled.detail.candidates[1].raw_prob, math.exp(-2.5))
    assert sampled.top_logprobs[1].id == -1  # an alternative the upstream names only by its text
    assert delta.text == " Paris"


def test_a_chunk_without_logprobs_counts_as_one_token_and_usage_comes_from_the_upstream() -> None:
    reader = ChunkReader(n=1, sent=0.0, seed=5)
    for t, text in enumerate(["Hel", "lo", "!"], start=1):
        reader.read(_chat(text), t * 0.01)
    reader.read(_chat(finish="length"), 0.04)
    assert not reader.done
    reader.read(
        {
            "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 3}},
        },
        0.05,
    )
    assert reader.done
    ((index, finished),) = reader.finish(0.06)
    assert isinstance(finished, wire.Finished) and index == 0
    assert (finished.finish_reason, finished.prompt_tokens, finished.completion_tokens, finished.cached_tokens) == (
        "length",
        9,
        4,
        3,
    )
    assert (finished.text, finished.seed) == ("Hello!", 5)
    assert finished.timings.token_times == [0.01, 0.02, 0.03] and math.isclose(finished.timings.ttft, 0.01)
    assert finished.timings.mean_itl is not None and math.isclose(finished.timings.mean_itl, 0.01)


def test_legacy_completion_logprobs_are_read_too() -> None:
    reader = ChunkReader(n=1, sent=0.0)
    choice = {
        "index": 0,
        "text": " sky",
        "logprobs": {"tokens": [" sky"], "token_logprobs": [-0.2], "top_logprobs": [{" sky": -0.2, " sea": -1.9}]},
    }
    (_, sampled), _ = reader.read({"choices": [choice]}, 0.1)
    assert isinstance(sampled, wire.Sampled) and sampled.logprob == -0.2
    assert [t.token for t in sampled.top_logprobs] == [" sky", " sea"]


def test_streamed_tool_calls_become_the_text_the_apis_tool_call_reader_takes_apart() -> None:
    reader = ChunkReader(n=1, sent=0.0)
    first = {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "weather", "arguments": '{"ci'}}]}
    second = {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}
    reader.read(_chat(delta=first), 0.1)
    reader.read(_chat(delta=second), 0.2)
    ((_, calls),) = reader.read(_chat(finish="tool_calls"), 0.3)
    assert isinstance(calls, wire.TextDelta)
    body = calls.text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
    assert json.loads(body) == {"name": "weather", "arguments": {"city": "Oslo"}}


def test_with_several_choices_the_upstreams_total_is_kept_and_split_by_what_each_reported() -> None:
    reader = ChunkReader(n=2, sent=0.0)
    reader.read(_chat("a", index=0), 0.1)
    reader.read(_chat("b", index=1), 0.1)
    reader.read(_chat("c", index=1), 0.2)
    reader.read(
        {
            "choices": [
                {"index": 0, "delta": {}, "finish_reason": "stop"},
                {"index": 1, "delta": {}, "finish_reason": "stop"},
            ]
        },
        0.3,
    )
    reader.read({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 5}}, 0.3)
    finished = {i: e for i, e in reader.finish(0.4) if isinstance(e, wire.Finished)}
    assert sum(f.completion_tokens for f in finished.values()) == 5
    assert finished[1].completion_tokens == 2


def test_the_upstreams_own_timings_are_kept_as_short_named_numbers_only() -> None:
    reader = ChunkReader(n=1, sent=0.0)
    reader.read(_chat("Hi"), 0.01)
    assert reader.server_timings is None  # an upstream that sends none (vLLM, another Roundtrip)
    reported = {"prompt_n": 20, "prompt_ms": 175.9, "predicted_ms": 40.2, "note": "<b>", "flag": True}
    reported |= {"nan": float("nan"), "x" * 41: 1, **{f"t{i}": i for i in range(30)}}
    reader.read(_chat(finish="length") | {"timings": reported}, 0.02)
    timings = reader.server_timings
    assert timings is not None and len(timings) == MAX_SERVER_TIMINGS
    assert (timings["prompt_n"], timings["prompt_ms"], timings["predicted_ms"]) == (20, 175.9, 40.2)
    assert not {"note", "flag", "nan", "x" * 41} & set(timings)
