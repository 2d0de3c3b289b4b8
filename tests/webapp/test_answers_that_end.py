"""Structured answers end on their own (`webapp.api.structured`'s bounds), on a live server: forced tool calls are a
bounded number of calls, JSON answers close, a call cut by max_tokens is reported, and streamed tool calls carry what
the whole answer carries."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from gguf import GGUFReader
from weather import CITY, GET_WEATHER

from inference.loader import default_model_path
from webapp.api.structured import MAX_ITEMS, MAX_PARALLEL_CALLS, MAX_STRING

pytestmark = pytest.mark.django_db(transaction=True)
OPEN_CITY = {key: value for key, value in CITY.items() if key != "additionalProperties"}  # closed by the bounds
WEATHER = {"type": "function", "function": {**GET_WEATHER, "parameters": OPEN_CITY}}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


def sdk(site_server: Any, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=site_server.api, api_key=key, max_retries=0, timeout=120)


@pytest.mark.parametrize(("parallel", "most"), [(None, 1), (False, 1), (True, MAX_PARALLEL_CALLS)])
def test_required_tool_calls_end_within_a_bounded_number_of_calls(
    site_server: Any, make_key: Any, parallel: bool | None, most: int
) -> None:
    """SmolLM2, sampled hot, wrote calls until max_tokens when the grammar let it: now it ends with `tool_calls`."""
    client = sdk(site_server, make_key())
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    for seed in range(3):
        reply = client.chat.completions.create(
            model="smollm2",
            messages=ASK,
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=2000,
            temperature=1.3,
            seed=seed,
            **extra,
        )  # type: ignore[call-overload]
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message
        assert 1 <= len(choice.message.tool_calls or []) <= most and not choice.message.content


def test_streamed_tool_calls_carry_exactly_what_the_whole_answer_carries(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    asked: dict[str, Any] = {
        "model": "smollm2",
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": True,
        "max_tokens": 2000,
        "temperature": 1.3,
        "seed": 7,
    }
    whole = client.chat.completions.create(**asked).choices[0].message
    content, calls = "", {}
    for chunk in client.chat.completions.create(**asked, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        content += (delta.content or "") if delta else ""
        for call in (delta.tool_calls or []) if delta else []:
            calls.setdefault(call.index, {"name": "", "arguments": ""})
            calls[call.index]["name"] += call.function.name or ""  # type: ignore[union-attr]
            calls[call.index]["arguments"] += call.function.arguments or ""  # type: ignore[union-attr]
    assert content == "" and whole.content is None  # no "\n" between calls
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c.function.name, "arguments": c.function.arguments}  # type: ignore[union-attr]
        for c in whole.tool_calls or []
    ]


def test_a_call_cut_by_max_tokens_is_reported_with_the_arguments_it_has(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    asked: dict[str, Any] = {"model": "smollm2", "messages": ASK, "tools": [WEATHER], "tool_choice": "required"}
    full = client.chat.completions.create(**asked, max_tokens=60, temperature=0)
    arguments = full.choices[0].message.tool_calls[0].function.arguments  # type: ignore[index,union-attr]
    assert full.usage is not None and json.loads(arguments) == {"city": "Paris"}
    # after "Paris" come `"}`, `}`, a newline, `</tool_call>` (5 tokens) and the end-of-turn token: 9 in all
    cut = client.chat.completions.create(**asked, max_tokens=full.usage.completion_tokens - 9, temperature=0)
    choice = cut.choices[0]
    assert choice.finish_reason == "length" and len(choice.message.tool_calls or []) == 1
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather" and arguments.startswith(call.function.arguments)  # type: ignore[union-attr]
    assert call.function.arguments != arguments  # type: ignore[union-attr]


def _tokens_with(*characters: str) -> dict[str, int]:
    """logit_bias pushing down every token of the default model's vocabulary that holds one of `characters`."""
    reader = GGUFReader(default_model_path())
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode() for i in field.data]
    return {str(i): -100 for i, token in enumerate(tokens) if any(c in token for c in characters)}


@pytest.mark.parametrize(
    ("schema", "shunned", "bound"),
    [
        ({"type": "string", "minLength": 1}, '"', lambda value: len(value) == MAX_STRING),  # not `""` at once
        ({"type": "array", "items": {"type": "integer", "maximum": 9}}, "]", lambda value: len(value) == MAX_ITEMS),
    ],
)
def test_a_string_or_list_the_model_would_never_close_is_closed_at_its_bound(
    site_server: Any, make_key: Any, schema: dict[str, Any], shunned: str, bound: Any
) -> None:
    """Every token that could close it is pushed down by -100: only the grammar's bound ends it, and the object
    (whose only property it is) closes after it."""
    client = sdk(site_server, make_key())
    answer = {"type": "object", "properties": {"value": schema}, "required": ["value"]}
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Write a long poem."}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": answer}},
        logit_bias=_tokens_with(shunned),
        temperature=0,
        max_tokens=1000,
    )
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    value = json.loads(reply.choices[0].message.content or "")
    assert list(value) == ["value"] and bound(value["value"])


@pytest.mark.parametrize(
    "prompt", ["Give me a JSON object with a person's name and age.", "Return the weather in Paris."]
)
def test_json_object_answers_close(site_server: Any, make_key: Any, prompt: str) -> None:
    client = sdk(site_server, make_key())
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": prompt}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=300,
    )
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
