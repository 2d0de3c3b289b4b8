"""The one typed wire between the web side and inference workers: every message and every trace event, as classes.

The worker builds these, the web side parses them, both with the definitions below (checked by mypy on both ends).
Torch-free and Django-free, so the gateway, the API and the page import it without the engine.

Over the Channels channel layer a message travels as a plain dict (msgpack on Redis): `encode` turns one into a dict,
`decode_request` / `decode_reply` turn a dict back into its class, checking every field on the way; a dict that does
not fit raises `WireError`, which fails that one request (never the socket or the worker).

msgspec Structs, chosen by measuring the per-token round trip (build, encode, decode) of a step's events:
`benchmarks/bench_wire.py` prints msgspec beside pydantic and plain dicts.

Requests go to a worker's own inbox (`channel` in its heartbeat; `webapp.worker.registry` picks the least-loaded live
worker) or, before any worker has reported, to the model's shared work channel `inference.<model id>`:
    Generate, Tokenize, Detokenize, Inspect, PromptAttention, Resample
Control messages go to the inbox named in the Queued reply: Cancel, Next.
Replies come, in order, on the requester's `reply_to` channel:
    Queued → Accepted → Waiting* / Events* (the trace, ending with a Finished event), or Error / Cancelled instead;
    Tokens / Detokenized / Inspection / PromptAttentionMatrix / Resampled answer the one-shot questions.
`sent_at` is wall-clock seconds, so a worker can tell how long a message waited, even across machines.
"""

from __future__ import annotations

import typing
from typing import Any, Literal, TypeVar

import msgspec

from inference.errors import ContextLengthExceededError, InvalidRequestError
from inference.params import SamplingParams

Level = Literal["off", "summary", "full"]


class WireError(ValueError):
    """A message that does not fit its class: what was wrong, in msgspec's words (field path included)."""


class Wire(msgspec.Struct):
    """Every wire class (build them with keywords: field order is not part of the wire)."""


# --- trace events: what the engine computed, in the form the API and the page read --------------------------------


class Segment(Wire):
    """A run of prompt tokens with one meaning (system prompt, earlier turns, the new message, template markup)."""

    kind: Literal["system", "history", "message", "markup"]
    role: str | None
    message_index: int | None
    token_start: int
    token_end: int
    char_start: int
    char_end: int


class Attention(Wire):
    """Attention weights [layers, heads, positions] as base64 uint8 rows, each scaled to its own maximum:
    weight = byte / 255 * row_max. `positions` lists which cached positions the columns are (a bounded selection:
    the first few and the most recent); `kv_length` how many there were in all."""

    shape: list[int]
    kv_length: int
    positions: list[int]
    row_max: list[list[float]]
    data: str


class LensGuess(Wire):
    """The logit lens at one point of the residual stream: its top token through the final norm and head."""

    layer: int
    id: int
    token: str
    prob: float


class Neuron(Wire):
    """One feed-forward neuron for one token: silu(gate) times up is what the down projection receives from it."""

    index: int
    gate: float
    up: float
    activation: float


class LayerDetail(Wire):
    """Inside the forward pass for one token (`full` level): see `inference.trace.LayerDetail`."""

    attention: Attention
    residual_norms: list[float]
    attention_update_norms: list[float]
    feed_forward_update_norms: list[float]
    logit_lens: list[LensGuess]
    logit_lens_after_attention: list[LensGuess]
    top_neurons: list[list[Neuron]]


class Candidate(Wire):
    """One of the likeliest next tokens and what the sampler's filters made of it."""

    token_id: int
    token: str
    raw_prob: float
    adjusted_prob: float
    removed_by: str | None
    final_prob: float
    bias: float = 0.0


class SamplingDetail(Wire):
    candidates: list[Candidate]
    draw: float | None
    kept: int
    eos_prob: float
    grammar_cut: int = 0
    mask_seconds: float = 0.0


class TopLogprob(Wire):
    id: int
    token: str
    logprob: float
    bytes: list[int]


class Timings(Wire):
    """Where a request's time went, in seconds; token_times are seconds since the request reached the worker."""

    tokenize: float
    queue: float
    prefill: float
    prefill_saved: float
    ttft: float
    decode: float
    total: float
    token_times: list[float]
    mean_itl: float | None
    decode_tokens_per_s: float | None
    pauses: list[float] = []  # per gap between tokens: seconds paused in step mode (left out of ITL and tokens/s)


class Event(Wire, tag_field="event"):
    """A trace event; `t` is the worker's `time.perf_counter()` when it happened."""

    t: float


class Tokenized(Event, tag="tokenized"):
    duration: float
    text: str
    ids: list[int]
    spans: list[tuple[int, int]]
    tokens: list[str]
    pieces: list[str] = []  # each as the vocabulary writes it ("▁capital", "<0xF0>"); empty in older recordings
    tokenizer: str = ""  # "byte-level BPE" or "SentencePiece"


class ContextBuilt(Event, tag="context"):
    segments: list[Segment]
    prompt_tokens: int
    max_tokens: int
    context_length: int
    dropped_messages: int
    rope_base: float
    rope_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    cached_tokens: int = 0
    dim: int = 0  # 0: a recording made before the event carried the model's width
    ffn_dim: int = 0
    vocab_size: int = 0
    layer_windows: list[int] = []  # empty: every layer sees every position (or a recording from before windows)
    local_rope_base: float = 0.0


class BatchStep(Event, tag="batch"):
    step: int
    batch_size: int
    prefill_tokens: int
    decode_tokens: int
    duration: float
    requests: list[str]


class ForwardStep(Event, tag="forward"):
    step: int
    phase: Literal["prefill", "decode"]
    position: int
    n_tokens: int
    kv_length: int
    duration: float
    batch_step: int = 0
    detail: LayerDetail | None = None


class Sampled(Event, tag="sampled"):
    step: int
    token_id: int
    token: str
    bytes: list[int]
    logprob: float
    rank: int
    is_stop: bool
    duration: float
    top_logprobs: list[TopLogprob] = []
    detail: SamplingDetail | None = None


class TextDelta(Event, tag="text"):
    step: int
    token_id: int  # -1 for the detokenizer's flush at the end
    token: str
    text: str
    pending_bytes: list[int]
    held_text: str


class Finished(Event, tag="finished"):
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int
    seed: int
    text: str
    timings: Timings
    cached_tokens: int = 0
    peers: list[str] = []
    max_batch_size: int = 1
    stop_string: str | None = None  # the request's stop string that ended it, when one did


TraceEvent = Tokenized | ContextBuilt | BatchStep | ForwardStep | Sampled | TextDelta | Finished


# --- requests ------------------------------------------------------------------------------------------------------


class Request(Wire, tag_field="type"):
    request_id: str


class Question(Request):
    """A request with an answer: where to send it, and for which model."""

    model: str
    reply_to: str


class Generate(Question, tag="generate"):
    messages: list[
        dict[str, Any]
    ]  # {"role", "content"} (+ "tool_calls", "tool_call_id", "name"), checked by the gateway
    params: SamplingParams
    level: Level = "off"
    tools: list[dict[str, Any]] | None = None  # function definitions {"name", "description", "parameters"}
    prompt: str | None = None  # instead of messages: raw text without the chat template (legacy completions)
    truncate_history: bool = False
    fit_max_tokens: bool = False  # max_tokens was a default: shrink it to the room left in the context
    step: bool = False  # step mode: pause after every token until a Next message
    n: int = 1  # choices: one prefill, n sequences decoded together; their events carry the choice's index
    continue_final: bool = False  # the last message is the assistant's unfinished answer: generation continues it
    sent_at: float = 0.0


class Tokenize(Question, tag="tokenize"):
    """Either `text` (tokenized as plain text) or `messages` (rendered with the chat template first)."""

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None


class Detokenize(Question, tag="detokenize"):
    ids: list[int]


class Inspect(Question, tag="inspect"):
    """Full-level detail for the last of `ids`, recomputed."""

    ids: list[int]


class PromptAttention(Question, tag="prompt_attention"):
    """The prefill's full token x token attention at one layer, for the first `ids` (the prompt)."""

    ids: list[int]
    layer: int


class Resample(Question, tag="resample"):
    """What if a past step had been sampled with `params`: the tokens before it (prompt, then output)."""

    prompt_ids: list[int]
    generated: list[int]
    params: SamplingParams


class Merges(Question, tag="merges"):
    """How BPE builds the tokens of `text` from its bytes, merge by merge (the tokenizer's own table)."""

    text: str


class NextTokens(Question, tag="next_tokens"):
    """`text` as the model reads it raw (its BOS where its file asks) and its likeliest next tokens: one side of the
    page's comparison of two models."""

    text: str


class Cancel(Request, tag="cancel"):
    pass


class Next(Request, tag="next"):
    pass


OneShot = Tokenize | Detokenize | Inspect | PromptAttention | Resample | Merges | NextTokens
AnyRequest = Generate | OneShot | Cancel | Next


# --- replies -------------------------------------------------------------------------------------------------------


class Reply(Wire, tag_field="type"):
    request_id: str


class Queued(Reply, tag="queued"):
    """The worker has the request; control messages go to `control`; `ahead` requests wait before it."""

    control: str
    worker: str
    ahead: int


class Waiting(Reply, tag="waiting"):
    """Still waiting for a slot in the running batch (sent when the count changes, to traced requests)."""

    ahead: int


class Accepted(Reply, tag="accepted"):
    """The request passed every check and waits for (or has) a slot."""

    control: str
    worker: str
    weights: str  # how the worker holds the model: "int4 (...), 116 MB"
    prompt_tokens: int
    seed: int
    queued: float  # seconds from arrival to acceptance (channel wait and tokenization)


class Events(Reply, tag="events"):
    """What one engine step produced for one choice of a request, in order: one message per step, not per event."""

    events: list[TraceEvent]
    index: int = 0  # the choice (n > 1)


class Error(Reply, tag="error"):
    status: int
    message: str
    code: str
    param: str | None = None
    retry_after: int | None = None
    ahead: int | None = None


class Cancelled(Reply, tag="cancelled"):
    pass


class Tokens(Reply, tag="tokens"):
    ids: list[int]
    tokens: list[str]
    spans: list[tuple[int, int]]
    text: str | None = None  # for messages: the rendered prompt the spans point into
    segments: list[Segment] | None = None  # for messages: system / history / message / markup ranges


class Detokenized(Reply, tag="detokenized"):
    text: str


class Inspection(Reply, tag="inspection"):
    detail: LayerDetail


class PromptAttentionMatrix(Reply, tag="prompt_attention"):
    attention: Attention  # [heads, query positions, key positions], as the trace's attention rows


class Resampled(Reply, tag="resampled"):
    event: Sampled  # drawn as the page draws a live one


class MergeStep(Wire):
    rank: int  # the merge's line in the table: lower merges first
    pair: tuple[str, str]
    symbols: list[str]  # the piece after this merge


class PieceMerges(Wire):
    text: str
    start: list[str]  # the piece's bytes, each a symbol
    merges: list[MergeStep]
    ids: list[int]


class MergeSteps(Reply, tag="merges"):
    pieces: list[PieceMerges]
    tokenizer: str = "byte-level BPE"  # or "SentencePiece": merges by score over characters, not by rank over bytes


class Likely(Wire):
    token_id: int
    token: str  # what it spells (control tokens by name)
    prob: float


class NextTokenView(Reply, tag="next_tokens"):
    ids: list[int]  # the text's tokens, with the BOS the model puts first where its file asks
    tokens: list[str]  # what each spells
    pieces: list[str]  # each as the vocabulary writes it ("▁the", "Ġthe", "<0xF0>")
    spans: list[tuple[int, int]]  # each one's characters in the text (a BOS: (0, 0))
    likely: list[Likely]  # the likeliest next tokens, best first
    tokenizer: str


AnyReply = (
    Queued
    | Waiting
    | Accepted
    | Events
    | Error
    | Cancelled
    | Tokens
    | Detokenized
    | Inspection
    | PromptAttentionMatrix
    | Resampled
    | MergeSteps
    | NextTokenView
)


# --- what a worker reports about itself ----------------------------------------------------------------------------


class ModelCard(Wire):
    """What a model is, for people (`inference.model_card`): the page's model card."""

    architecture: str
    name: str
    layers: int
    width: int
    heads: int
    kv_heads: int
    head_size: int
    feed_forward: int
    vocabulary: int
    context: int
    tokenizer: str
    chat_template: bool
    features: list[str]
    layer_windows: list[int]


class ModelLoad(Wire, omit_defaults=True):
    """One model's load progress, as `/health` and the page show it (fields not known yet are left out)."""

    state: Literal["loading", "ready", "failed", "not started", "unavailable"]
    stage: str | None = None
    done: int | None = None
    total: int | None = None
    detail: str | None = None
    weights: str | None = None  # once ready: format and size ("int4 (...), 116 MB")
    device: str | None = None
    card: ModelCard | None = None  # once ready


class ModelSlots(Wire):
    """What a worker holds of one model: its batch, queue and KV cache right now."""

    running: int
    waiting: int
    max_batch: int
    max_waiting: int
    kv_usage: float


class WorkerStatus(Wire):
    """A worker's heartbeat: who it is, where to reach it, and what it holds."""

    worker: str
    channel: str
    host: str
    pid: int
    t: float  # wall clock of the beat
    models: dict[str, ModelSlots]


# --- encoding ------------------------------------------------------------------------------------------------------

T = TypeVar("T")


def encode(message: Wire) -> dict[str, Any]:
    """A message as the plain dict the channel layer carries (and JSON or msgpack can hold)."""
    data: dict[str, Any] = msgspec.to_builtins(message)
    return data


def decode(data: object, kind: type[T]) -> T:
    """`data` as `kind` (a wire class or a union of them), every field checked; WireError naming what did not fit."""
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        raise WireError(str(exc)) from None


def _by_tag(union: Any) -> dict[str, type[Wire]]:
    return {member.__struct_config__.tag: member for member in typing.get_args(union)}


# A top-level union is converted by its tag here: msgspec caches what it knows of each Struct class, not of a union
# object, and converting to the union itself cost ten times converting to the class (benchmarks/bench_wire.py).
REQUESTS, REPLIES = _by_tag(AnyRequest), _by_tag(AnyReply)


def _decode_tagged(data: object, kinds: dict[str, type[Wire]], union: Any) -> Any:
    kind = kinds.get(data.get("type")) if isinstance(data, dict) else None  # type: ignore[arg-type]
    if kind is None:  # the object or its tag is wrong: the union says which, in msgspec's words
        decode(data, union)
        raise WireError(f"not a message: {data!r:.200}")
    return decode(data, kind)


def decode_request(data: object) -> AnyRequest:
    request: AnyRequest = _decode_tagged(data, REQUESTS, AnyRequest)
    return request


def decode_reply(data: object) -> AnyReply:
    reply: AnyReply = _decode_tagged(data, REPLIES, AnyReply)
    return reply


def plain(value: Any) -> Any:
    """Wire objects (anywhere inside dicts and lists) as plain JSON-safe values, for the page's frames."""
    return msgspec.to_builtins(value)


# --- errors --------------------------------------------------------------------------------------------------------


def overloaded(request_id: str, waiting: int, retry_after: int = 2) -> Error:
    return Error(
        request_id=request_id,
        status=503,
        code="overloaded",
        retry_after=retry_after,
        ahead=waiting,
        message=f"Server busy: {waiting} requests are ahead of you. Retry in {retry_after} s.",
    )


def error_reply(request_id: str, exc: Exception) -> Error:
    """An inference-side failure as a reply the gateway turns into an OpenAI-style error."""
    if isinstance(exc, ContextLengthExceededError):
        return Error(
            request_id=request_id, status=400, message=str(exc), code="context_length_exceeded", param="messages"
        )
    if isinstance(exc, InvalidRequestError):
        return Error(request_id=request_id, status=400, message=str(exc), code="invalid_value", param=exc.param)
    return Error(
        request_id=request_id,
        status=500,
        code="server_error",
        message=f"The model failed ({type(exc).__name__}); the worker logged the details.",
    )
