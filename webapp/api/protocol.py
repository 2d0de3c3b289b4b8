"""The API's typed request models (pydantic, in the manner of vLLM's protocol.py): one per endpoint.

Each model is the single source of the endpoint's rules: it validates a body (errors name the
parameter, in OpenAI's wording), turns it into what the engine needs (sampling parameters, plain
chat messages), and its JSON schema is what `/v1/openapi.json` serves. Every field of OpenAI's
Chat Completions request is accepted; the ones that change nothing here are listed back in the
`x-roundtrip-ignored-fields` response header. Unknown fields are refused, as OpenAI does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from inference.params import MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, SamplingParams
from webapp.api import structured
from webapp.gateway.errors import GatewayError, bad_request
from webapp.gateway.json_input import BadJSON, loads_object


class StrictModel(BaseModel):
    """Every request model: unknown fields refused (as OpenAI does), no type coercion, no NaN or infinity."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


MAX_MESSAGES = 4096  # far beyond any context window this server holds; a cheap first bound
MAX_N = 8  # choices per request: each takes a slot of the batch
MAX_TOOLS = 128
LEGACY_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ToolCallFunction(StrictModel):
    name: str
    arguments: str


class ToolCall(StrictModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_where_required(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required")
        return self

    @property
    def text(self) -> str:
        """The content as one string: text parts joined (the only part type a text model takes)."""
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class JsonSchemaSpec(StrictModel):
    name: FunctionName
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _enforceable(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None:
            structured.check_schema(schema)
        return schema


class ResponseFormat(StrictModel):
    """`text`, `json_object` (any JSON object) or `json_schema` (JSON valid against the given schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_where_needed(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise _Conflict(
                "response_format.json_schema", "'json_schema' is required with type 'json_schema', and only there."
            )
        return self

    @property
    def answer_schema(self) -> dict[str, Any] | None:
        if self.type == "json_object":
            return structured.ANY_OBJECT
        if self.json_schema is not None:
            return self.json_schema.schema_ or structured.ANY_OBJECT
        return None


class FunctionDefinition(StrictModel):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _enforceable(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        if parameters is not None:
            structured.check_schema(parameters)
        return parameters


class ToolDefinition(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(StrictModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: running usage counts in every chunk
    include_obfuscation: bool = Field(
        True,
        description="Accepted; chunks here carry no obfuscation padding (the stream is not sent to third parties).",
    )


Probability = Annotated[float, Field(ge=0, le=1)]


class SamplingFields(StrictModel):
    """The sampling and streaming fields both completion endpoints share, and their conversion to SamplingParams."""

    model: str = Field(min_length=1)
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    min_p: Probability | None = None
    repetition_penalty: Annotated[float, Field(gt=0, le=10)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    stop: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_STRINGS)]
        | None
    ) = None
    seed: Annotated[int, Field(ge=-(2**63), le=2**64 - 1)] | None = Field(
        None,
        description="Makes sampling repeatable (under the same system_fingerprint); "
        "with n > 1, choice i uses seed + i.",
    )
    n: Annotated[int, Field(ge=1, le=MAX_N)] = Field(
        1, description=f"Choices to generate (at most {MAX_N}): one prefill, decoded together."
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="Your id for the end user; kept in this server's usage log.")
    ignore_eos: bool = Field(
        False, description="Keep generating past end-of-turn tokens (fixed output lengths for benchmarks)."
    )
    logit_bias: (
        dict[Annotated[str, Field(pattern=r"^[0-9]{1,9}$")], Annotated[float, Field(ge=-100, le=100)]] | None
    ) = Field(None, description="Token id (as a string) to a value added to its logit before sampling, -100 to 100.")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def _check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise _Conflict("stream_options", "'stream_options' is only allowed when 'stream' is true.")

    def sampling(self, max_tokens: int, top_logprobs: int = 0, grammar: str | None = None) -> SamplingParams:
        def given(value: float | None, default: float) -> float:
            return default if value is None else value

        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            temperature=given(self.temperature, 1.0),
            top_p=given(self.top_p, 1.0),
            top_k=self.top_k or 0,
            min_p=given(self.min_p, 0.0),
            repetition_penalty=given(self.repetition_penalty, 1.0),
            presence_penalty=given(self.presence_penalty, 0.0),
            frequency_penalty=given(self.frequency_penalty, 0.0),
            seed=self.seed,
            max_tokens=max_tokens,
            stop=stop,
            top_logprobs=top_logprobs,
            ignore_eos=self.ignore_eos,
            logit_bias=tuple((int(token), bias) for token, bias in (self.logit_bias or {}).items()),
            grammar=grammar,
        )


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    tools: list[ToolDefinition] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    continue_final_message: bool = Field(
        False,
        description="vLLM's: the last message is the assistant's unfinished answer, and "
        "generation continues its text instead of starting a new turn.",
    )
    # The legacy function-calling fields, mapped onto tools and tool_choice (the answer comes as tool calls).
    functions: list[FunctionDefinition] | None = Field(None, max_length=MAX_TOOLS, description="Legacy: as tools.")
    function_call: Literal["none", "auto"] | NamedFunction | None = Field(None, description="Legacy: as tool_choice.")
    # Accepted for compatibility; they change nothing here (listed in x-roundtrip-ignored-fields).
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    prompt_cache_key: str | None = Field(None, description="Accepted: the prefix cache here needs no key.")
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    # Capabilities this server does not have: refused naming the field, rather than answered without them.
    web_search_options: dict[str, Any] | None = Field(None, description="Refused: no web search here.")
    audio: dict[str, Any] | None = Field(None, description="Refused: no audio output here.")
    moderation: dict[str, Any] | None = Field(None, description="Refused: no moderation here.")

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        self._refuse_missing_capabilities()
        self._map_legacy_functions()
        if self.top_logprobs and not self.logprobs:
            raise _Conflict("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.")
        self._check_stream_options()
        names = [t.function.name for t in self.tools or ()]
        if self.tool_choice not in (None, "none", "auto") and not names:
            raise _Conflict("tool_choice", "'tool_choice' asks for a tool call, but 'tools' is empty.")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise _Conflict(
                "tool_choice",
                f"'tool_choice' names the function {self.tool_choice.function.name!r}, which is not in 'tools'.",
            )
        if len(set(names)) != len(names):
            raise _Conflict("tools", "Function names in 'tools' must be unique.")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise _Conflict(
                "continue_final_message", "'continue_final_message' needs the last message to be the assistant's."
            )
        return self

    def _refuse_missing_capabilities(self) -> None:
        lacking = {"web_search_options": "web search", "audio": "audio output", "moderation": "moderation"}
        for name, what in lacking.items():
            if getattr(self, name) is not None:
                raise _Conflict(name, f"'{name}' asks for {what}, which this server does not have; leave it out.")

    def _map_legacy_functions(self) -> None:
        """`functions` become function tools and `function_call` the tool choice, as OpenAI's deprecation maps them."""
        if self.functions is None and self.function_call is None:
            return
        if self.tools is not None or self.tool_choice is not None:
            raise _Conflict(
                "functions", "Give 'tools' and 'tool_choice', or the legacy 'functions' and 'function_call'."
            )
        self.tools = [ToolDefinition(type="function", function=f) for f in self.functions or ()]
        call = self.function_call
        self.tool_choice = NamedToolChoice(type="function", function=call) if isinstance(call, NamedFunction) else call

    IGNORED: ClassVar[tuple[str, ...]] = (
        "metadata",
        "store",
        "service_tier",
        "reasoning_effort",
        "modalities",
        "prediction",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "verbosity",
    )

    @property
    def ignored_fields(self) -> list[str]:
        return [name for name in self.IGNORED if name in self.model_fields_set]

    @property
    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages as the chat template takes them (developer is the system role; tool calls kept)."""
        return [_plain(m) for m in self.messages]

    @property
    def offered_tools(self) -> list[FunctionDefinition]:
        """The functions shown to the model: none when tool_choice is "none", only the named one when it names one."""
        if not self.tools or self.tool_choice == "none":
            return []
        functions = [t.function for t in self.tools]
        if isinstance(self.tool_choice, NamedToolChoice):
            return [f for f in functions if f.name == self.tool_choice.function.name]
        return functions

    @property
    def tool_definitions(self) -> list[dict[str, Any]] | None:
        """The offered functions as the worker renders them into the prompt."""
        return [f.model_dump(exclude_none=True) for f in self.offered_tools] or None

    @property
    def grammar(self) -> str | None:
        """What the output must follow: a forced call, a JSON answer, either, or nothing (free text)."""
        functions = [structured.Function(f.name, f.parameters) for f in self.offered_tools]
        forced = self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)
        several = self.parallel_tool_calls is True and not isinstance(self.tool_choice, NamedToolChoice)
        answer = self.response_format.answer_schema if self.response_format else None
        return structured.grammar(answer, functions, forced, several)

    @property
    def upstream_fields(self) -> dict[str, Any]:
        """What an upstream server is given as the client sent it: it follows a JSON answer's format and a tool
        choice itself (a local model has them as `grammar`)."""
        fields = ("response_format", "tool_choice", "parallel_tool_calls")
        return self.model_dump(include=set(fields), exclude_none=True, by_alias=True)

    @property
    def max_tokens_given(self) -> bool:
        return self.max_completion_tokens is not None or self.max_tokens is not None

    @property
    def params(self) -> SamplingParams:
        max_tokens = self.max_completion_tokens or self.max_tokens or settings.ROUNDTRIP_DEFAULT_MAX_TOKENS
        return self.sampling(max_tokens, self.top_logprobs or 0, self.grammar)


class CompletionRequest(SamplingFields):
    """POST /v1/completions (legacy): a raw text prompt, continued as it is, without the chat template."""

    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] = Field(
        description="The text to continue (a list holds exactly one text: batches of prompts are not served)."
    )
    echo: bool = Field(False, description="Put the prompt before the completion in the returned text.")
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = Field(
        None, description="Log-probabilities of each token and its best alternatives (0-5)."
    )
    suffix: str | None = Field(None, description="Refused unless empty: this model does not fill in the middle.")
    best_of: Annotated[int, Field(ge=1, le=MAX_N)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> CompletionRequest:
        self._check_stream_options()
        if self.suffix:
            raise _Conflict(
                "suffix",
                "'suffix' is not supported: this model cannot fill in the middle; put all the text in 'prompt'.",
            )
        if self.best_of is not None and self.best_of != self.n:
            raise _Conflict("best_of", "'best_of' other than 'n' is not supported: every generated choice is returned.")
        if self.echo and self.logprobs is not None:
            raise _Conflict(
                "echo", "'echo' with 'logprobs' is not supported: prompt tokens have no log-probabilities here."
            )
        return self

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def max_tokens_given(self) -> bool:
        return self.max_tokens is not None

    @property
    def params(self) -> SamplingParams:
        return self.sampling(self.max_tokens or LEGACY_MAX_TOKENS, self.logprobs or 0)


def _plain(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text}
    if m.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


class TokenizeRequest(StrictModel):
    """POST /v1/tokenize: plain `text`, or chat `messages` rendered with the model's template (ids, token strings, the
    rendered prompt and its segments: system prompt, earlier turns, the new message, template markup)."""

    model: str = Field(min_length=1)
    text: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=MAX_MESSAGES)
    tools: list[ToolDefinition] | None = Field(
        None, max_length=MAX_TOOLS, description="With messages: shown to the model as a chat request's tools are."
    )

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.text is None) == (self.messages is None):
            raise _Conflict("text", "Give either 'text' or 'messages'.")
        return self

    @property
    def chat_messages(self) -> list[dict[str, Any]] | None:
        if self.messages is None:
            return None
        return [_plain(m) for m in self.messages]

    @property
    def tool_definitions(self) -> list[dict[str, Any]] | None:
        return [t.function.model_dump(exclude_none=True) for t in self.tools] if self.tools else None


class DetokenizeRequest(StrictModel):
    """POST /v1/detokenize: token ids back to text."""

    model: str = Field(min_length=1)
    tokens: list[Annotated[int, Field(ge=0)]] = Field(max_length=1_000_000)


class _Conflict(ValueError):
    """Two fields that do not go together; `param` names the one to change."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def json_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; 400 for non-UTF-8 bytes, invalid JSON, a non-object, or text that is not text."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"The request body is not valid UTF-8 (byte {exc.start}).") from None
    try:
        return loads_object(text)
    except BadJSON as exc:
        raise bad_request(exc.message, exc.param) from None


def parse(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """Validate `body` as `model`; the first problem becomes a 400 in OpenAI's shape, naming the parameter."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        deepest = max(errors, key=lambda e: len(e["loc"]))  # of a union's branches, the one that got furthest
        raise _as_gateway_error(deepest) from None


def _param(loc: tuple[Any, ...]) -> str:
    """("messages", 0, "role") → "messages[0].role"; union branches (type names) and the tags of tagged unions
    (the string after an index into a list[tagged-union[...]]) are left out."""
    out, tagged, after_tagged_index = "", False, False
    for part in loc:
        if after_tagged_index:
            after_tagged_index = False
            continue
        if isinstance(part, int):
            out += f"[{part}]"
            after_tagged_index, tagged = tagged, False
        elif isinstance(part, str) and part.startswith("list[tagged-union["):
            tagged = True
        elif isinstance(part, str) and not (
            part
            in (
                "str",
                "int",
                "float",
                "bool",
                "list[str]",
                "list[TextPart]",
                "function-after[_content_where_required(), ChatMessage]",
            )
            or part.startswith(("list[", "constrained-", "function-", "literal[", "tagged-union["))
        ):
            out += f".{part}" if out else part
    return out


def _as_gateway_error(error: Mapping[str, Any]) -> GatewayError:
    kind, param = error["type"], _param(tuple(error["loc"]))
    value = json.dumps(error.get("input"), default=str)[:60]
    ctx = error.get("ctx") or {}
    if isinstance(ctx.get("error"), _Conflict):
        conflict: _Conflict = ctx["error"]
        return bad_request(str(conflict), conflict.param)
    if kind == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {param}", param)
    if kind == "missing" or (kind == "value_error" and "content is required" in error["msg"]):
        missing = param if kind == "missing" else f"{param}.content"
        return bad_request(f"Missing required parameter: '{missing}'.", missing)
    if param == "messages" and kind == "too_short":
        return bad_request("'messages' must contain at least one message.", "messages")
    if param == "n" and kind in ("less_than_equal", "greater_than_equal"):
        return bad_request(f"'n' must be between 1 and {MAX_N} (got {value}).", "n")
    if kind in (
        "float_type",
        "int_type",
        "bool_type",
        "string_type",
        "dict_type",
        "list_type",
        "model_type",
        "int_from_float",
        "finite_number",
    ):
        expected = {
            "float_type": "a number",
            "int_type": "an integer",
            "int_from_float": "an integer",
            "bool_type": "a boolean",
            "string_type": "a string",
            "dict_type": "an object",
            "model_type": "an object",
            "list_type": "a list",
            "finite_number": "a finite number",
        }[kind]
        return bad_request(f"Invalid type for '{param}': expected {expected}, got {value}.", param)
    if kind == "union_tag_invalid":
        return bad_request(
            f"Invalid type for '{param}': {json.dumps(ctx.get('tag'))} is not served here; "
            f"expected one of {ctx.get('expected_tags')}.",
            param,
        )
    if kind == "literal_error":
        return bad_request(
            f"Invalid value for '{param}': {value}; expected {ctx.get('expected', 'one of the allowed values')}.", param
        )
    return bad_request(f"Invalid '{param}': {str(error['msg']).removeprefix('Value error, ')} (got {value}).", param)
