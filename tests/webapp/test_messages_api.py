"""Anthropic's Messages API on a live server, driven by Anthropic's own SDK: answers streamed and not, tool use and
its result, token counting, and errors in Anthropic's shape."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from weather import CITY, GET_WEATHER

from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)
SYSTEM = "You are a helpful assistant."  # as the chat API's tests ask it: the same 27-token prompt
QUESTION = [{"role": "user", "content": "What's the capital of India?"}]
WEATHER = {"name": "get_weather", "description": GET_WEATHER["description"], "input_schema": CITY}


def sdk(site_server: Any, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=site_server.url, api_key=key, max_retries=0, timeout=60)


def test_a_message_is_answered_streamed_or_not_with_the_same_text(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    reply = client.messages.create(
        model="smollm2", max_tokens=40, system=SYSTEM, extra_body={"temperature": 0}, messages=QUESTION
    )  # type: ignore[arg-type]
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.model == "smollm2-135m-instruct" and reply.stop_reason == "end_turn"
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text == "The capital of India is New Delhi."  # type: ignore[union-attr]
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (27, 9)
    row = UsageRecord.objects.get(request_id=reply.id)
    assert (row.endpoint, row.status, row.prompt_tokens, row.completion_tokens) == ("messages", 200, 27, 9)

    with client.messages.stream(
        model="smollm2", max_tokens=40, system=SYSTEM, extra_body={"temperature": 0}, messages=QUESTION
    ) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert streamed.content[0].text == reply.content[0].text and streamed.stop_reason == "end_turn"  # type: ignore[union-attr]
    assert streamed.usage.output_tokens == 9
    cut = client.messages.create(model="smollm2", max_tokens=3, extra_body={"temperature": 0}, messages=QUESTION)  # type: ignore[arg-type]
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    asked: dict[str, Any] = {"model": "smollm2", "max_tokens": 40, "system": SYSTEM, "messages": QUESTION}
    stopped = client.messages.create(**asked, stop_sequences=["India"], extra_body={"temperature": 0})
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "India"
    assert stopped.content[0].text == "The capital of "  # type: ignore[union-attr]
    with client.messages.stream(**asked, stop_sequences=["India"], extra_body={"temperature": 0}) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "India")


def test_a_tool_is_used_and_its_result_answered(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    forced: dict[str, Any] = {
        "model": "smollm2",
        "max_tokens": 60,
        "extra_body": {"temperature": 0},
        "messages": ask,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    reply = client.messages.create(**forced)
    assert reply.stop_reason == "tool_use"
    use = next(b for b in reply.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input, dict) and "city" in use.input  # type: ignore[union-attr]
    with client.messages.stream(**forced) as stream:
        streamed = stream.get_final_message()
    streamed_use = next(b for b in streamed.content if b.type == "tool_use")
    assert streamed_use.input == use.input and streamed.stop_reason == "tool_use"  # type: ignore[union-attr]
    followed = client.messages.create(
        model="smollm2",
        max_tokens=40,
        extra_body={"temperature": 0},
        tools=[WEATHER],  # type: ignore[list-item]
        messages=[  # type: ignore[list-item]
            *ask,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}],
            },  # type: ignore[union-attr]
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 °C"}]},  # type: ignore[union-attr]
        ],
    )
    assert followed.content and followed.usage.output_tokens > 0


def test_tokens_are_counted_as_the_model_reads_them(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    counted = client.messages.count_tokens(model="smollm2", system=SYSTEM, messages=QUESTION)  # type: ignore[arg-type]
    assert counted.input_tokens == 27  # the templated prompt the answer's usage counts
    bare = client.messages.count_tokens(model="smollm2", messages=QUESTION)  # type: ignore[arg-type]
    assert bare.input_tokens == 37  # with the template's own, longer system prompt


def test_errors_come_in_anthropics_shape(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-opus-9", max_tokens=5, messages=QUESTION)  # type: ignore[arg-type]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="smollm2", max_tokens=5, messages=QUESTION, extra_body={"temperature": 1.5})  # type: ignore[arg-type]
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        sdk(site_server, "rt-not-a-key").messages.create(model="smollm2", max_tokens=5, messages=QUESTION)  # type: ignore[arg-type]
