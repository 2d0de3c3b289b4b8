"""OpenAI's Responses API on a live server, driven by OpenAI's own SDK: answers streamed and not, a function tool's
round trip through `function_call_output`, structured output through `text.format`, conversations continued by
`previous_response_id`, stored responses read and deleted, and what is refused."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from weather import GET_WEATHER

from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)
SYSTEM = "You are a helpful assistant."  # as the chat API's tests ask it: the same 27-token prompt
QUESTION = "What's the capital of India?"
WEATHER = {"type": "function", **GET_WEATHER, "strict": True}


def sdk(site_server: Any, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=site_server.api, api_key=key, max_retries=0, timeout=60)


def test_a_response_is_the_same_streamed_or_not_and_leaves_a_usage_row(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    asked: dict[str, Any] = {
        "model": "smollm2",
        "instructions": SYSTEM,
        "input": QUESTION,
        "temperature": 0,
        "max_output_tokens": 40,
    }
    reply = client.responses.create(**asked)
    assert reply.id.startswith("resp_") and reply.object == "response" and reply.status == "completed"
    assert reply.model == "smollm2-135m-instruct" and reply.output_text == "The capital of India is New Delhi."
    assert [item.type for item in reply.output] == ["message"]
    assert reply.usage is not None and (reply.usage.input_tokens, reply.usage.output_tokens) == (27, 9)
    row = UsageRecord.objects.get(request_id=reply.id)
    assert (row.endpoint, row.status, row.prompt_tokens, row.completion_tokens) == ("responses", 200, 27, 9)

    events = list(client.responses.create(**asked, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas == final.output_text == reply.output_text and final.usage.output_tokens == 9

    with client.responses.stream(**asked) as stream:
        helper = stream.get_final_response()
    assert helper.output_text == reply.output_text


def test_a_response_cut_by_max_output_tokens_is_incomplete(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    cut = client.responses.create(model="smollm2", input=QUESTION, temperature=0, max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens" and cut.usage is not None
    assert cut.usage.output_tokens == 3 and cut.output[0].status == "incomplete"  # type: ignore[union-attr]
    kinds = [e.type for e in client.responses.create(model="smollm2", input=QUESTION, max_output_tokens=3, stream=True)]
    assert kinds[-1] == "response.incomplete"


def test_a_function_tool_round_trips_through_function_call_output(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    forced: dict[str, Any] = {
        "model": "smollm2",
        "input": ask,
        "tools": [WEATHER],
        "tool_choice": "required",
        "temperature": 0,
        "max_output_tokens": 60,
    }
    reply = client.responses.create(**forced)
    assert reply.status == "completed" and [item.type for item in reply.output] == ["function_call"]
    call = reply.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}

    events = list(client.responses.create(**forced, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")  # type: ignore[union-attr]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert args == done.arguments == call.arguments and done.name == "get_weather"  # type: ignore[union-attr]
    assert not any(e.type == "response.output_text.delta" for e in events)  # no stray text between or after calls

    answered = client.responses.create(
        model="smollm2",
        input=[*ask, call, {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 °C"}],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        temperature=0,
        max_output_tokens=40,
    )
    assert answered.status in ("completed", "incomplete") and answered.output_text
    row = UsageRecord.objects.get(request_id=answered.id)
    assert row.prompt_tokens > reply.usage.input_tokens  # type: ignore[union-attr]  # the call and its result were in the prompt


def test_text_format_json_schema_gives_json_valid_against_the_schema(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    reply = client.responses.create(
        model="smollm2",
        input="Name a city and its country.",
        text={"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}},
        temperature=0,
        max_output_tokens=80,
    )
    assert reply.status == "completed" and reply.text is not None and reply.text.format is not None
    assert reply.text.format.type == "json_schema"
    assert set(json.loads(reply.output_text)) == {"city", "country"}


def test_a_stored_response_is_continued_read_and_deleted_by_its_owner_only(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    first = client.responses.create(
        model="smollm2", instructions=SYSTEM, input=QUESTION, temperature=0, max_output_tokens=40
    )
    second = client.responses.create(
        model="smollm2", previous_response_id=first.id, input="And of France?", temperature=0, max_output_tokens=40
    )
    assert second.previous_response_id == first.id and "Paris" in second.output_text
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the earlier turn came along
    assert client.responses.retrieve(first.id).output_text == first.output_text

    stranger = sdk(site_server, make_key())
    with pytest.raises(openai.NotFoundError) as refused:
        stranger.responses.retrieve(first.id)
    assert refused.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError) as refused:
        stranger.responses.create(model="smollm2", previous_response_id=first.id, input="Hi")
    assert refused.value.param == "previous_response_id"

    unstored = client.responses.create(model="smollm2", input="Hi", store=False, max_output_tokens=5)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ],
)
def test_what_this_server_cannot_honour_is_refused_naming_the_field(
    site_server: Any, make_key: Any, fields: dict[str, Any], param: str
) -> None:
    client = sdk(site_server, make_key())
    body = {"input": "Hi", **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="smollm2", extra_body=body)  # type: ignore[call-overload]
    assert refused.value.param == param


def test_fields_with_no_effect_here_are_accepted_and_named(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    raw = client.responses.with_raw_response.create(
        model="smollm2",
        input="Hi",
        max_output_tokens=4,
        truncation="auto",
        include=["message.output_text.logprobs"],
        prompt_cache_key="abc",
        safety_identifier="user-1",
        reasoning={"effort": "low"},
    )
    ignored = raw.headers["x-roundtrip-ignored-fields"].split(", ")
    assert set(ignored) == {"include", "truncation", "reasoning", "prompt_cache_key", "safety_identifier"}
    assert raw.parse().status in ("completed", "incomplete")
