"""What today's OpenAI SDK sends, through the SDK itself against a live server: model lookup by id, every field of the
chat request it knows (accepted and named when it changes nothing, refused when it needs a capability this server
lacks), the legacy function-calling fields, and the legacy completions' own ids."""

from __future__ import annotations

import json
from typing import Any, get_type_hints

import openai
import pytest
from openai import OpenAI
from openai.types.chat import completion_create_params
from weather import GET_WEATHER

from webapp.api.protocol import ChatCompletionRequest
from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)
HI = [{"role": "user", "content": "the heat is on"}]


def sdk(site_server: Any, key: str) -> OpenAI:
    return OpenAI(base_url=site_server.api, api_key=key, max_retries=0, timeout=60)


def test_a_model_is_found_by_its_id_or_an_alias_and_only_by_keys_that_may_use_it(
    site_server: Any, make_key: Any
) -> None:
    client = sdk(site_server, make_key())
    model = client.models.retrieve("smollm2")  # an alias
    assert model.id == "smollm2-135m-instruct" and model.object == "model" and model.owned_by == "roundtrip"
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-5")
    assert info.value.code == "model_not_found"
    limited = sdk(site_server, make_key(allowed_models=["tiny"]))
    with pytest.raises(openai.NotFoundError):
        limited.models.retrieve("smollm2")
    assert UsageRecord.objects.filter(endpoint="models.retrieve").count() == 4


def test_every_field_the_sdk_knows_is_a_field_of_the_request() -> None:
    sdk_fields = set(get_type_hints(completion_create_params.CompletionCreateParamsBase, include_extras=False))
    sdk_fields |= {"stream"}
    assert sdk_fields <= set(ChatCompletionRequest.model_fields)


def test_the_newer_fields_are_accepted_and_named_as_ignored(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    newer: dict[str, Any] = {
        "prompt_cache_key": "conversation-7",
        "prompt_cache_retention": "24h",
        "safety_identifier": "user-hash-1",
        "verbosity": "low",
    }
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=HI,  # type: ignore[arg-type]
        max_tokens=3,
        **newer,
    )
    assert raw.http_response.status_code == 200
    assert set(raw.headers["x-roundtrip-ignored-fields"].split(", ")) == set(newer)
    stream = client.chat.completions.create(
        model="tiny",
        messages=HI,  # type: ignore[arg-type]
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


@pytest.mark.parametrize(
    "field, value",
    [
        ("web_search_options", {"search_context_size": "low"}),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("moderation", {"model": "omni-moderation-latest"}),
    ],
)
def test_a_field_that_needs_a_capability_this_server_lacks_is_a_400_naming_it(
    site_server: Any, make_key: Any, field: str, value: Any
) -> None:
    client = sdk(site_server, make_key())
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=3, extra_body={field: value})  # type: ignore[arg-type]
    assert info.value.param == field and "this server does not have" in info.value.message


def test_legacy_functions_are_answered_as_tool_calls(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    functions = [GET_WEATHER]
    reply = client.chat.completions.create(
        model="smollm2",  # the tiny model's context is too short for a function's description
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        max_tokens=60,
        temperature=0,
        functions=functions,  # type: ignore[arg-type]
        function_call={"name": "get_weather"},
    )
    calls = reply.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert "city" in json.loads(calls[0].function.arguments)  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny",
            messages=HI,  # type: ignore[arg-type]
            max_tokens=3,
            functions=functions,  # type: ignore[arg-type]
            tools=[{"type": "function", "function": functions[0]}],  # type: ignore[list-item]
        )
    assert info.value.param == "functions"


def test_legacy_completions_have_their_own_ids(site_server: Any, make_key: Any) -> None:
    client = sdk(site_server, make_key())
    reply = client.completions.create(model="tiny", prompt="the heat", max_tokens=3)
    assert reply.id.startswith("cmpl-") and reply.object == "text_completion"
    assert UsageRecord.objects.filter(request_id=reply.id, endpoint="completions").count() == 1
    chat = client.chat.completions.create(model="tiny", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    assert chat.id.startswith("chatcmpl-")
