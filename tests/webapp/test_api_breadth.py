"""What real clients send, on the real model through a live server and the official SDK: structured outputs, tool
calls (forced, streamed, in history), n choices, logit_bias, legacy completions, detokenize, fingerprint and user."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

import httpx2 as httpx
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)
CAPITAL = [{"role": "user", "content": "What's the capital of India?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}


def sdk(site_server: Any, key: str) -> OpenAI:
    return OpenAI(base_url=site_server.api, api_key=key, max_retries=0, timeout=120)


class Address(BaseModel):
    city: str
    country: str


class Person(BaseModel):
    name: str
    occupation: str
    address: Address


class Colour(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class SkyColour(BaseModel):
    colour: Colour


class Fruits(BaseModel):
    fruits: list[str] = Field(max_length=5)  # a small model left alone repeats "strawberry" until max_tokens


@pytest.mark.parametrize(
    ("schema", "question"),
    [
        (Person, "Describe a famous scientist: name, occupation and where they lived."),
        (SkyColour, "What colour is the sky on a clear day?"),
        (Fruits, "Name three fruits."),
    ],
    ids=["nested object", "enum", "array"],
)
def test_parse_returns_a_parsed_object_for_a_pydantic_schema(
    site_server: Any, make_key: Any, schema: type[BaseModel], question: str
) -> None:
    reply = sdk(site_server, make_key()).chat.completions.parse(
        model="smollm2",
        messages=[{"role": "user", "content": question}],
        response_format=schema,
        temperature=0,
        max_completion_tokens=200,
    )
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, schema), reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("seed", range(3))
def test_json_object_always_parses(site_server: Any, make_key: Any, seed: int) -> None:
    reply = sdk(site_server, make_key()).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Give the name and the country of the capital of France, as JSON."}],
        response_format={"type": "json_object"},
        temperature=1,
        seed=seed,
        max_tokens=500,
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


def _valid_weather_arguments(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")


def test_a_named_tool_choice_forces_a_call_with_valid_arguments(site_server: Any, make_key: Any) -> None:
    reply = sdk(site_server, make_key()).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What's the weather like in Paris?"}],
        tools=[WEATHER_TOOL, TIME_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls or []
    # type: ignore[union-attr]
    assert (
        len(calls) == 1
        and calls[0].type == "function"
        and calls[0].function.name == "get_weather"
        and calls[0].id.startswith("call_")
    )
    _valid_weather_arguments(calls[0].function.arguments)  # type: ignore[union-attr]


def test_a_forced_tool_call_streams_as_openai_streams_it(site_server: Any, make_key: Any) -> None:
    stream = sdk(site_server, make_key()).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Weather in Tokyo, please."}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        stream=True,
    )
    deltas = [d for chunk in stream for choice in chunk.choices for d in (choice.delta.tool_calls or [])]
    first = deltas[0]
    assert (
        first.index == 0
        and first.id
        and first.type == "function"
        and first.function
        and first.function.name == "get_weather"
    )
    assert first.function.arguments == "" and len(deltas) > 2  # the arguments come in fragments after the opening delta
    assert all(d.id is None and d.index == 0 for d in deltas[1:])
    _valid_weather_arguments("".join(d.function.arguments or "" for d in deltas if d.function))


def test_tool_calls_and_results_in_history_are_shown_to_the_model(site_server: Any, make_key: Any) -> None:
    messages = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    client = sdk(site_server, make_key())
    # type: ignore[arg-type,list-item]
    reply = client.chat.completions.create(
        model="smollm2", messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=40
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    prompt = httpx.post(
        f"{site_server.api}/tokenize",
        json={"model": "smollm2", "messages": messages, "tools": [WEATHER_TOOL]},
        headers={"Authorization": f"Bearer {make_key()}"},
    ).json()
    text = prompt["prompt"]
    assert "<tools>" in text and '"name": "get_weather"' in text  # the documented system-prompt format
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>' in text
    )
    assert '<tool_response>\n{"temperature": 21, "sky": "sunny"}\n</tool_response>' in text


def test_n_choices_are_reproducible_with_a_seed_and_counted_once_for_the_prompt(
    site_server: Any, make_key: Any
) -> None:
    client = sdk(site_server, make_key())

    def ask() -> Any:
        # type: ignore[arg-type]
        return client.chat.completions.create(
            model="smollm2", messages=CAPITAL, n=3, temperature=1, seed=11, max_tokens=16
        )

    first, second = ask(), ask()
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2] and len(set(texts)) > 1
    assert [c.message.content for c in second.choices] == texts
    single = client.chat.completions.create(model="smollm2", messages=CAPITAL, max_tokens=1)  # type: ignore[arg-type]
    assert (
        first.usage is not None and single.usage is not None and first.usage.prompt_tokens == single.usage.prompt_tokens
    )
    row = UsageRecord.objects.get(request_id=first.id)
    assert row.completion_tokens == first.usage.completion_tokens > 16


def test_n_choices_stream_with_their_index(site_server: Any, make_key: Any) -> None:
    # type: ignore[arg-type]
    stream = sdk(site_server, make_key()).chat.completions.create(
        model="smollm2", messages=CAPITAL, n=2, temperature=0, max_tokens=12, stream=True
    )
    texts = {0: "", 1: ""}
    finished = set()
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1} and texts[0] == texts[1] != ""  # greedy: both choices say the same


def test_logit_bias_against_the_greedy_first_token_changes_it(site_server: Any, make_key: Any) -> None:
    key = make_key()
    client = sdk(site_server, key)
    # type: ignore[arg-type]
    greedy = client.chat.completions.create(
        model="smollm2", messages=CAPITAL, temperature=0, max_tokens=8, logprobs=True
    )
    first = greedy.choices[0].logprobs.content[0].token  # type: ignore[union-attr,index]
    ids = httpx.post(
        f"{site_server.api}/tokenize",
        json={"model": "smollm2", "text": first},
        headers={"Authorization": f"Bearer {key}"},
    ).json()["ids"]
    assert len(ids) == 1
    # type: ignore[arg-type]
    biased = client.chat.completions.create(
        model="smollm2", messages=CAPITAL, temperature=0, max_tokens=8, logprobs=True, logit_bias={str(ids[0]): -100}
    )
    assert biased.choices[0].logprobs.content[0].token != first  # type: ignore[union-attr,index]


def test_continue_final_message_goes_on_from_the_assistants_text(site_server: Any, make_key: Any) -> None:
    key = make_key()
    client = sdk(site_server, key)
    full = client.chat.completions.create(model="smollm2", messages=CAPITAL, temperature=0, max_tokens=12)  # type: ignore[arg-type]
    text = full.choices[0].message.content or ""
    prefix = text[: text.index(" is") + 3]  # "... India is"
    go_on = client.chat.completions.create(
        model="smollm2",
        messages=[*CAPITAL, {"role": "assistant", "content": prefix}],
        temperature=0,  # type: ignore[list-item]
        max_tokens=12,
        extra_body={"continue_final_message": True},
    )
    assert (go_on.choices[0].message.content or "").startswith(text[len(prefix) :])
    refused = httpx.post(
        f"{site_server.api}/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "smollm2", "messages": CAPITAL, "continue_final_message": True},
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "continue_final_message"


def test_legacy_completions_continue_raw_text(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    reply = client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2
    )
    choice = reply.choices[0]
    assert reply.object == "text_completion" and choice.text and choice.finish_reason in ("stop", "length")
    assert choice.logprobs is not None and "".join(choice.logprobs.tokens or []) == choice.text
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs or [])
    assert reply.usage is not None and reply.usage.prompt_tokens == 5
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == choice.text
    echoed = client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0, echo=True
    )
    assert echoed.choices[0].text == "The capital of France is" + choice.text


def test_legacy_completions_refuse_suffix_clearly(site_server: Any, make_key: Any) -> None:
    r = httpx.post(
        f"{site_server.api}/completions",
        json={"model": "smollm2", "prompt": "def f(", "suffix": "return x"},
        headers={"Authorization": f"Bearer {make_key()}"},
    )
    assert (
        r.status_code == 400
        and r.json()["error"]["param"] == "suffix"
        and "fill in the middle" in r.json()["error"]["message"]
    )


def test_tokenize_then_detokenize_round_trips(site_server: Any, make_key: Any) -> None:
    headers = {"Authorization": f"Bearer {make_key()}"}
    text = "Grüße from New Delhi 🇮🇳, 2026!"
    ids = httpx.post(f"{site_server.api}/tokenize", json={"model": "smollm2", "text": text}, headers=headers).json()[
        "ids"
    ]
    back = httpx.post(f"{site_server.api}/detokenize", json={"model": "smollm2", "tokens": ids}, headers=headers).json()
    assert back["text"] == text


def test_system_fingerprint_names_the_weights_and_user_is_kept(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    a = client.chat.completions.create(model="smollm2", messages=CAPITAL, temperature=0, max_tokens=2, user="alice-42")  # type: ignore[arg-type]
    b = client.chat.completions.create(model="smollm2", messages=CAPITAL, temperature=0, max_tokens=2)  # type: ignore[arg-type]
    assert (
        a.system_fingerprint and a.system_fingerprint.startswith("fp_") and a.system_fingerprint == b.system_fingerprint
    )
    assert UsageRecord.objects.get(request_id=a.id).end_user == "alice-42"
