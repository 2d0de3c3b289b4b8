"""The chat request model: what it accepts, how it names what it refuses, and what it turns a body into."""

from __future__ import annotations

from typing import Any

import pytest

from webapp.api.protocol import ChatCompletionRequest, parse
from webapp.gateway.errors import GatewayError

HI = [{"role": "user", "content": "hi"}]


def refused(body: dict[str, Any]) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        parse(ChatCompletionRequest, body)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"model": "t", "messages": HI, "temperature": "hot"}, "temperature", "expected a number"),
        ({"model": "t", "messages": HI, "temperature": 3}, "temperature", "less than or equal to 2"),
        ({"model": "t", "messages": HI, "temperature": float("nan")}, "temperature", "finite"),
        ({"model": "t", "messages": HI, "max_tokens": True}, "max_tokens", "expected an integer"),
        ({"model": "t", "messages": HI, "max_tokens": 1.5}, "max_tokens", "expected an integer"),
        ({"model": "t", "messages": HI, "banana": 1}, "banana", "Unrecognized request argument supplied: banana"),
        ({"model": "t", "messages": []}, "messages", "at least one message"),
        ({"model": "t", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "messages[0].role"),
        (
            {"model": "t", "messages": [{"role": "user"}]},
            "messages[0].content",
            "Missing required parameter: 'messages[0].content'",
        ),
        (
            {"model": "t", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
            "messages[0].content[0].type",
            "\"image_url\"; expected 'text'",
        ),
        ({"messages": HI}, "model", "Missing required parameter: 'model'"),
        ({"model": "t", "messages": HI, "n": 9}, "n", "between 1 and 8"),
        ({"model": "t", "messages": HI, "top_logprobs": 2}, "top_logprobs", "requires 'logprobs'"),
        (
            {"model": "t", "messages": HI, "stream_options": {"include_usage": True}},
            "stream_options",
            "only allowed when 'stream' is true",
        ),
        ({"model": "t", "messages": HI, "stop": ["a", "b", "c", "d", "e"]}, "stop", "stop"),
        ({"model": "t", "messages": HI, "stop": ""}, "stop", "stop"),
    ],
)
def test_it_refuses_what_openai_refuses_naming_the_parameter(body: dict[str, Any], param: str, words: str) -> None:
    error = refused(body)
    assert error.param == param and words in error.message, (error.param, error.message)


def test_a_valid_body_becomes_messages_and_sampling_parameters() -> None:
    request = parse(
        ChatCompletionRequest,
        {
            "model": "t",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ],
            "temperature": 0,
            "max_completion_tokens": 7,
            "stop": "END",
            "seed": 3,
            "stream": True,
            "stream_options": {"continuous_usage_stats": True},
            "metadata": {"k": "v"},
            "store": False,
        },
    )
    assert request.chat_messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]
    params = request.params
    assert (params.temperature, params.max_tokens, params.stop, params.seed) == (0.0, 7, ("END",), 3)
    assert request.continuous_usage and not request.include_usage and request.max_tokens_given
    assert request.ignored_fields == ["metadata", "store"]


def test_an_assistant_turn_with_tool_calls_needs_no_content() -> None:
    request = parse(
        ChatCompletionRequest,
        {
            "model": "t",
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
        },
    )
    assert [m["role"] for m in request.chat_messages] == ["user", "assistant", "tool"]
