"""POST /v1/messages and /v1/messages/count_tokens in Anthropic's shape: the request model, and its translation into the
chat request this server already validates and serves (`ChatCompletionRequest`), so both APIs share one grammar, one
tool prompt and one engine path. Blocks: text, tool_use (an assistant's call) and tool_result (the caller's answer to
it); images and documents are refused, as are extended thinking and server tools."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from inference.params import MAX_STOP_STRINGS
from webapp.api.protocol import (
    MAX_MESSAGES,
    MAX_TOOLS,
    ChatCompletionRequest,
    FunctionName,
    StrictModel,
    _Conflict,
    parse,
)
from webapp.gateway.errors import bad_request


class TextBlock(StrictModel):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # accepted: the prefix cache needs no marks


class ToolUseBlock(StrictModel):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: FunctionName
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(StrictModel):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[TextBlock] = ""
    is_error: bool = False
    cache_control: dict[str, Any] | None = None


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class InputMessage(StrictModel):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(StrictModel):
    name: FunctionName
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(StrictModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class CountTokensRequest(StrictModel):
    """POST /v1/messages/count_tokens: the prompt's fields only."""

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None

    @property
    def chat_messages(self) -> list[dict[str, Any]]:
        """The conversation as chat messages: the system prompt first, calls as tool_calls, results as tool turns."""
        system = self.system if isinstance(self.system, str) else "".join(b.text for b in self.system or ())
        out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        for message in self.messages:
            out += _chat(message)
        return out

    @property
    def chat_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools:
            return None
        return [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in self.tools
        ]


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1, le=1_000_000)
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = Field(None, max_length=MAX_STOP_STRINGS)
    stream: bool = False
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    metadata: dict[str, Any] | None = None
    # accepted; they change nothing here
    service_tier: str | None = None
    cache_control: dict[str, Any] | None = None
    container: str | dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    inference_geo: str | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    output_config: dict[str, Any] | None = Field(None, description="Accepted without 'format' (refused: use tools).")
    thinking: dict[str, Any] | None = Field(None, description="Refused: this model does not think before answering.")

    @model_validator(mode="after")
    def _supported(self) -> MessagesRequest:
        if self.thinking is not None and self.thinking.get("type") != "disabled":
            raise _Conflict("thinking", "'thinking' is not available on this server; leave it out.")
        if self.output_config and self.output_config.get("format") is not None:
            raise _Conflict("output_config.format", "Structured output through 'output_config' is not served here.")
        return self

    def as_chat(self) -> ChatCompletionRequest:
        """The same request as a chat completion, validated as one (so its errors name the chat field)."""
        body: dict[str, Any] = {"model": self.model, "messages": self.chat_messages, "max_tokens": self.max_tokens}
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.stop_sequences:
            body["stop"] = self.stop_sequences
        if self.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        if self.metadata and isinstance(self.metadata.get("user_id"), str):
            body["user"] = self.metadata["user_id"]
        if self.chat_tools:
            body["tools"] = self.chat_tools
            choice = self.tool_choice
            if choice is not None:
                body["tool_choice"] = {"auto": "auto", "none": "none", "any": "required"}.get(choice.type) or {
                    "type": "function",
                    "function": {"name": choice.name or ""},
                }
                body["parallel_tool_calls"] = not choice.disable_parallel_tool_use
        request: ChatCompletionRequest = parse(ChatCompletionRequest, body)
        return request


def _chat(message: InputMessage) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: text joined; tool_use as the assistant's tool_calls; each tool_result
    as a tool message (before any text the user sent with it)."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
    calls = [
        {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
        for b in message.content
        if isinstance(b, ToolUseBlock)
    ]
    results = [
        {
            "role": "tool",
            "tool_call_id": b.tool_use_id,
            "content": b.content if isinstance(b.content, str) else "".join(t.text for t in b.content),
        }
        for b in message.content
        if isinstance(b, ToolResultBlock)
    ]
    if message.role == "assistant":
        return [{"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}]
    if calls:
        raise bad_request("tool_use blocks belong to the assistant's messages.", "messages")
    return results + ([{"role": "user", "content": text}] if text or not results else [])
