"""The one protocol between the web side and inference workers, over the Channels channel layer: typed messages.

Torch-free on purpose: the web side builds and reads these without importing the engine.
Channel-layer messages must be plain dicts (msgpack on Redis), so they are TypedDicts.

Requests go to a worker's own inbox (`channel` in its heartbeat; `webapp.worker.registry`
picks the least-loaded live worker) or, before any worker has reported, to the model's
shared work channel `inference.<model id>`, which every worker holding the model consumes:
    GenerateRequest, TokenizeRequest, InspectRequest
Control messages go to the inbox named in the "queued" reply: CancelMessage, NextMessage.
Replies come, in order, on the requester's `reply_to` channel:
    Queued → Accepted → Waiting* / EventsReply* (the trace, ending with the "finished" event)
    or an ErrorReply / CancelledReply instead; TokensReply / InspectionReply answer the others.
`sent_at` is wall-clock seconds, so a worker can tell how long a message waited, even across machines.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from inference.errors import ContextLengthExceededError, InvalidRequestError
from inference.params import SamplingParams

# --- requests -------------------------------------------------------------------------------


class SamplingDict(TypedDict, total=False):
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    seed: int
    max_tokens: int
    stop: list[str]
    top_logprobs: int
    ignore_eos: bool
    logit_bias: list[list[float]]  # [[token id, bias], ...]
    grammar: str  # Lark text for constrained decoding


class GenerateRequest(TypedDict):
    type: Literal["generate"]
    model: str
    request_id: str
    reply_to: str
    messages: list[
        dict[str, Any]
    ]  # {"role", "content"} (+ "tool_calls", "tool_call_id", "name"), checked by the gateway's parser
    tools: NotRequired[list[dict[str, Any]]]  # function definitions {"name", "description", "parameters"}
    prompt: NotRequired[str]  # instead of messages: raw text without the chat template (legacy completions)
    params: SamplingDict
    level: str  # "off" | "summary" | "full"
    truncate_history: bool
    fit_max_tokens: bool  # max_tokens was a default: shrink it to the room left in the context
    step: bool  # step mode: pause after every token until a NextMessage
    sent_at: float
    n: NotRequired[int]  # choices (default 1): one prefill, n sequences decoded together; events carry their "index"
    continue_final: NotRequired[bool]  # the last message is the assistant's unfinished answer: generation continues it


class TokenizeRequest(TypedDict):
    """Either `text` (tokenized as plain text) or `messages` (rendered with the chat template first)."""

    type: Literal["tokenize"]
    model: str
    request_id: str
    reply_to: str
    text: NotRequired[str]
    messages: NotRequired[list[dict[str, Any]]]
    tools: NotRequired[list[dict[str, Any]]]


class DetokenizeRequest(TypedDict):
    type: Literal["detokenize"]
    model: str
    request_id: str
    reply_to: str
    ids: list[int]


class InspectRequest(TypedDict):
    type: Literal["inspect"]
    model: str
    request_id: str
    reply_to: str
    ids: list[int]
    sent_at: float


class PromptAttentionRequest(TypedDict):
    """The prefill's full token x token attention at one layer, for the first `ids` (the prompt)."""

    type: Literal["prompt_attention"]
    model: str
    request_id: str
    reply_to: str
    ids: list[int]
    layer: int


class ResampleRequest(TypedDict):
    """What if a past step had been sampled with `params`: the tokens before it (prompt, then output)."""

    type: Literal["resample"]
    model: str
    request_id: str
    reply_to: str
    prompt_ids: list[int]
    generated: list[int]
    params: SamplingDict


class CancelMessage(TypedDict):
    type: Literal["cancel"]
    request_id: str


class NextMessage(TypedDict):
    type: Literal["next"]
    request_id: str


# --- replies --------------------------------------------------------------------------------


class Queued(TypedDict):
    """The worker has the request; control messages go to `control`; `ahead` requests wait before it."""

    type: Literal["queued"]
    request_id: str
    control: str
    worker: str
    ahead: int


class Waiting(TypedDict):
    """Still waiting for a slot in the running batch (sent when the count changes, to traced requests)."""

    type: Literal["waiting"]
    request_id: str
    ahead: int


class Accepted(TypedDict):
    """The request passed every check and waits for (or has) a slot."""

    type: Literal["accepted"]
    request_id: str
    control: str
    worker: str
    weights: str  # how the worker holds the model: "int4 (...), 116 MB"
    prompt_tokens: int
    seed: int
    queued: float  # seconds from arrival to acceptance (channel wait and tokenization)


class EventsReply(TypedDict):
    """What one engine step produced for this request: its trace events, in order (serialized by inference.trace_json).

    One message per step, not per event: at 16 streams the web side handles a few hundred
    of these a second beside the engine, on the same cores."""

    type: Literal["events"]
    request_id: str
    index: NotRequired[int]  # the choice (n > 1) these events belong to
    events: list[dict[str, Any]]


class ErrorReply(TypedDict):
    type: Literal["error"]
    request_id: str
    status: int
    message: str
    code: str
    param: str | None
    retry_after: NotRequired[int]
    ahead: NotRequired[int]


class CancelledReply(TypedDict):
    type: Literal["cancelled"]
    request_id: str


class TokensReply(TypedDict):
    type: Literal["tokens"]
    request_id: str
    ids: list[int]
    tokens: list[str]
    spans: list[list[int]]
    text: NotRequired[str]  # for messages: the rendered prompt the spans point into
    segments: NotRequired[list[dict[str, Any]]]  # for messages: system / history / message / markup ranges


class TextReply(TypedDict):
    type: Literal["text"]
    request_id: str
    text: str


class InspectionReply(TypedDict):
    type: Literal["inspection"]
    request_id: str
    detail: dict[str, Any]


class PromptAttentionReply(TypedDict):
    type: Literal["prompt_attention"]
    request_id: str
    attention: dict[str, Any]  # [heads, query positions, key positions], encoded as the trace's attention rows


class ResampledReply(TypedDict):
    type: Literal["resampled"]
    request_id: str
    event: dict[str, Any]  # a "sampled" trace event, as the page draws a live one


Reply = (
    Queued
    | Waiting
    | Accepted
    | EventsReply
    | ErrorReply
    | CancelledReply
    | TokensReply
    | InspectionReply
    | ResampledReply
    | PromptAttentionReply
)


# --- what a worker reports about itself -------------------------------------------------------


class ModelLoad(TypedDict):
    """One model's load progress, as `/health` and the page show it."""

    state: str  # "loading" | "ready" | "failed" | "not started"
    stage: NotRequired[str]
    done: NotRequired[int]
    total: NotRequired[int]
    detail: NotRequired[str]
    weights: NotRequired[str]  # once ready: format and size ("int4 (...), 116 MB")
    device: NotRequired[str]


class ModelSlots(TypedDict):
    """What a worker holds of one model: its batch, queue and KV cache right now."""

    running: int
    waiting: int
    max_batch: int
    max_waiting: int
    kv_usage: float


class WorkerStatus(TypedDict):
    """A worker's heartbeat: who it is, where to reach it, and what it holds."""

    worker: str
    channel: str
    host: str
    pid: int
    t: float  # wall clock of the beat
    models: dict[str, ModelSlots]


# --- conversions ------------------------------------------------------------------------------

PARAM_FIELDS = tuple(SamplingDict.__annotations__)


def params_to_dict(params: SamplingParams) -> SamplingDict:
    out: dict[str, Any] = {}
    for name in PARAM_FIELDS:
        value = getattr(params, name)
        if value is not None:
            out[name] = (
                [list(pair) for pair in value] if name == "logit_bias" else list(value) if name == "stop" else value
            )
    return out  # type: ignore[return-value]


def params_from_dict(values: SamplingDict) -> SamplingParams:
    fields: dict[str, Any] = {name: values[name] for name in PARAM_FIELDS if name in values}  # type: ignore[literal-required]
    if "stop" in fields:
        fields["stop"] = tuple(fields["stop"])
    if "logit_bias" in fields:
        fields["logit_bias"] = tuple((int(token), float(bias)) for token, bias in fields["logit_bias"])
    return SamplingParams(**fields)


def overloaded(request_id: str, waiting: int, retry_after: int = 2) -> ErrorReply:
    return {
        "type": "error",
        "request_id": request_id,
        "status": 503,
        "code": "overloaded",
        "param": None,
        "retry_after": retry_after,
        "ahead": waiting,
        "message": f"Server busy: {waiting} requests are ahead of you. Retry in {retry_after} s.",
    }


def error_reply(request_id: str, exc: Exception) -> ErrorReply:
    """An inference-side failure as a reply the gateway turns into an OpenAI-style error."""
    if isinstance(exc, ContextLengthExceededError):
        return {
            "type": "error",
            "request_id": request_id,
            "status": 400,
            "message": str(exc),
            "code": "context_length_exceeded",
            "param": "messages",
        }
    if isinstance(exc, InvalidRequestError):
        return {
            "type": "error",
            "request_id": request_id,
            "status": 400,
            "message": str(exc),
            "code": "invalid_value",
            "param": exc.param,
        }
    return {
        "type": "error",
        "request_id": request_id,
        "status": 500,
        "message": f"The model failed ({type(exc).__name__}); the worker logged the details.",
        "code": "server_error",
        "param": None,
    }
