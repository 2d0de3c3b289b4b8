"""POST /v1/responses in OpenAI's Responses shape: the request model, and its translation into the chat request this
server already validates and serves (`ChatCompletionRequest`), so the Responses API shares the chat API's grammar,
tool prompt, sampling and engine path.

Input is a string or a list of items: messages (text parts), `function_call` (an earlier call of the model's) and
`function_call_output` (the caller's result for it). A stored earlier response (`previous_response_id`) supplies the
conversation before the input; `instructions` are not carried over from it, as OpenAI documents. Function tools are
served; built-in tools (web search, file search, computer use, code interpreter, MCP, …), background mode, reusable
prompts and conversations are refused with a 400 naming the field, rather than answered without them.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, model_validator

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

Status = Literal["in_progress", "completed", "incomplete"]


class InputText(StrictModel):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None  # an earlier answer's, sent back as it came
    logprobs: list[dict[str, Any]] | None = None
    prompt_cache_breakpoint: dict[str, Any] | None = None  # accepted: the prefix cache needs no marks


class Refusal(StrictModel):
    type: Literal["refusal"]
    refusal: str


Part = Annotated[InputText | Refusal, Field(discriminator="type")]


class MessageItem(StrictModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    id: str | None = None
    status: Status | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, InputText) else p.refusal for p in self.content)


class FunctionCallItem(StrictModel):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: FunctionName
    arguments: str
    id: str | None = None
    status: Status | None = None
    namespace: str | None = None


class FunctionCallOutputItem(StrictModel):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[InputText]
    id: str | None = None
    status: Status | None = None
    name: str | None = None
    namespace: str | None = None

    @property
    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


def _item_kind(value: Any) -> str:
    """Messages may leave out `type` (OpenAI's "easy" input message)."""
    if isinstance(value, dict):
        kind = value.get("type", "message")
        return kind if isinstance(kind, str) else "message"
    return str(getattr(value, "type", "message"))


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_kind),
]


class FunctionTool(StrictModel):
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    # accepted; they change nothing here
    allowed_callers: list[str] | None = None
    defer_loading: bool | None = None
    output_schema: dict[str, Any] | None = None


class HostedTool(StrictModel):
    """A built-in tool (web_search, file_search, computer_use, code_interpreter, mcp, …): refused by the request."""

    model_config = ConfigDict(extra="allow")
    type: str


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "function" if kind == "function" else "hosted"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[HostedTool, Tag("hosted")], Discriminator(_tool_kind)
]


class FunctionChoice(StrictModel):
    type: Literal["function"]
    name: FunctionName


class TextFormat(StrictModel):
    """`text.format`: plain text, any JSON object, or JSON valid against a schema (the chat API's response_format)."""

    type: Literal["text", "json_object", "json_schema"]
    name: FunctionName | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_where_needed(self) -> TextFormat:
        if self.type == "json_schema" and (self.schema_ is None or self.name is None):
            raise _Conflict("text.format", "A 'json_schema' format needs a 'name' and a 'schema'.")
        return self

    def as_response_format(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        spec: dict[str, Any] = {"name": self.name, "schema": self.schema_}
        if self.description is not None:
            spec["description"] = self.description
        if self.strict is not None:
            spec["strict"] = self.strict
        return {"type": "json_schema", "json_schema": spec}


class TextConfig(StrictModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class StreamOptions(StrictModel):
    include_obfuscation: bool = True  # accepted; events here carry no obfuscation padding


# Built-in tools and other capabilities this server does not have: named in a 400 rather than silently left out.
_HOSTED_TOOL = "'{kind}' tools need a capability this server does not have; only 'function' tools are served."


class ResponsesRequest(StrictModel):
    """POST /v1/responses."""

    model: str = Field(min_length=1)
    input: str | list[Item] = Field(max_length=MAX_MESSAGES)
    instructions: str | None = None
    previous_response_id: str | None = Field(None, description="Continue the conversation of a stored response.")
    store: bool = Field(
        True,
        description="Keep the response, so GET /v1/responses/{id} and previous_response_id find "
        "it (bounded and expiring: ROUNDTRIP_RESPONSES_KEEP, ROUNDTRIP_RESPONSES_DAYS).",
    )
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS, description="Function tools only.")
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    # accepted; they change nothing here (listed in x-roundtrip-ignored-fields)
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    max_tool_calls: Annotated[int, Field(ge=1)] | None = None
    context_management: list[dict[str, Any]] | None = None
    access_programs: dict[str, Any] | None = None
    # refused: capabilities this server does not have
    background: bool | None = Field(None, description="Refused when true: responses are answered while you wait.")
    background_options: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = Field(None, description="Refused: use previous_response_id.")
    prompt: dict[str, Any] | None = Field(None, description="Refused: no stored prompt templates here.")
    moderation: dict[str, Any] | None = Field(None, description="Refused: no moderation here.")
    image: dict[str, Any] | None = Field(None, description="Refused: no image input here.")

    IGNORED: ClassVar[tuple[str, ...]] = (
        "include",
        "truncation",
        "reasoning",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "max_tool_calls",
        "context_management",
        "access_programs",
    )

    @model_validator(mode="after")
    def _supported(self) -> ResponsesRequest:
        if self.background:
            raise _Conflict("background", "'background' mode is not available here; leave it out or false.")
        lacking = {
            "background_options": "background mode",
            "conversation": "the Conversations API (use previous_response_id)",
            "prompt": "stored prompt templates",
            "moderation": "moderation",
            "image": "image input",
        }
        for name, what in lacking.items():
            if getattr(self, name) is not None:
                raise _Conflict(name, f"'{name}' asks for {what}, which this server does not have; leave it out.")
        for i, tool in enumerate(self.tools or ()):
            if isinstance(tool, HostedTool):
                raise _Conflict(f"tools[{i}].type", _HOSTED_TOOL.format(kind=tool.type))
        if self.stream_options is not None and not self.stream:
            raise _Conflict("stream_options", "'stream_options' is only allowed when 'stream' is true.")
        return self

    @property
    def function_tools(self) -> list[FunctionTool]:
        return [t for t in self.tools or () if isinstance(t, FunctionTool)]

    @property
    def ignored_fields(self) -> list[str]:
        return [name for name in self.IGNORED if name in self.model_fields_set]

    @property
    def format(self) -> TextFormat:
        return self.text.format if self.text and self.text.format else TextFormat.model_validate({"type": "text"})

    def input_messages(self) -> list[dict[str, Any]]:
        """This request's input as chat messages (without the instructions): kept with the answer when stored."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        out: list[dict[str, Any]] = []
        for item in self.input:
            if isinstance(item, MessageItem):
                role = "system" if item.role == "developer" else item.role
                out.append({"role": role, "content": item.text})
            elif isinstance(item, FunctionCallItem):
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)  # parallel calls: one assistant turn
                elif last is not None and last["role"] == "assistant":
                    last["tool_calls"] = [call]  # the text the model wrote before its call
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            else:
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
        return out

    def as_chat(self, history: list[dict[str, Any]]) -> ChatCompletionRequest:
        """The request as a chat completion after `history` (a stored conversation), validated as one."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages += history + self.input_messages()
        if not messages:
            raise bad_request("'input' is empty and there is no earlier response to continue.", "input")
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        for name in ("temperature", "top_p", "user", "parallel_tool_calls"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.max_output_tokens is not None:
            body["max_completion_tokens"] = self.max_output_tokens
        if self.top_logprobs:
            body |= {"logprobs": True, "top_logprobs": self.top_logprobs}
        if self.format.type != "text":
            body["response_format"] = self.format.as_response_format()
        if self.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": t.model_dump(
                        include={"name", "description", "parameters", "strict"}, exclude_none=True
                    ),
                }
                for t in self.function_tools
            ]
        if self.tool_choice is not None:
            choice = self.tool_choice
            body["tool_choice"] = (
                {"type": "function", "function": {"name": choice.name}}
                if isinstance(choice, FunctionChoice)
                else choice
            )
        request: ChatCompletionRequest = parse(ChatCompletionRequest, body)
        return request
