"""Turning the worker's trace events into OpenAI objects: chat chunks, whole messages, legacy text completions.

A `Choice` follows one choice's events in order: the text it released, the log-probabilities of
the tokens behind that text, and (when tools were offered) the tool calls read out of the text.
Usage comes from the gateway's `Turn`, which counts every choice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from webapp.api.tool_calls import CallDelta, ToolCallParser
from webapp.gateway.lifecycle import Turn
from webapp.worker import wire


@dataclass
class Piece:
    """What one choice has to send now: text, the log-probabilities of the tokens behind it, tool-call deltas."""

    text: str
    logprobs: list[dict[str, Any]]
    calls: list[CallDelta] = field(default_factory=list)


@dataclass
class Choice:
    """One choice's events, in order; a token's logprobs travel with the text it released."""

    index: int
    want_logprobs: bool
    tools: bool = False  # read <tool_call> blocks out of the text
    pending: list[dict[str, Any]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finished: wire.Finished | None = None
    parser: ToolCallParser = field(default_factory=ToolCallParser)

    def feed(self, event: wire.TraceEvent) -> Piece | None:
        if isinstance(event, wire.Sampled):
            if self.want_logprobs and not event.is_stop:
                top = [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in event.top_logprobs]
                self.pending.append(
                    {"token": event.token, "logprob": event.logprob, "bytes": event.bytes, "top_logprobs": top}
                )
            return None
        if not isinstance(event, (wire.TextDelta, wire.Finished)):
            return None
        text = event.text if isinstance(event, wire.TextDelta) else ""
        calls: list[CallDelta] = []
        if self.tools:
            text, calls = self.parser.feed(text)
            if isinstance(event, wire.Finished):
                rest, cut = self.parser.finish()
                text, calls = text + rest, calls + cut
        if isinstance(event, wire.Finished):
            self.finished = event
        piece = Piece(text, self.pending, calls)
        self.pending = []
        self.text.append(piece.text)
        self.logprobs.extend(piece.logprobs)
        return piece if piece.text or piece.logprobs or piece.calls else None

    @property
    def finish_reason(self) -> str:
        if self.finished is None:
            return "cancelled"
        reason = self.finished.finish_reason
        return "tool_calls" if reason == "stop" and self.parser.calls else reason

    @property
    def content(self) -> str:
        return "".join(self.text)

    def message(self) -> dict[str, Any]:
        """The whole assistant message: content (None when there are only tool calls), refusal, tool_calls."""
        out: dict[str, Any] = {
            "role": "assistant",
            "content": self.content or (None if self.parser.calls else ""),
            "refusal": None,
        }
        if self.parser.calls:
            out["tool_calls"] = [call.as_dict() for call in self.parser.calls]
        return out


def choices_for(n: int, want_logprobs: bool, tools: bool = False) -> list[Choice]:
    return [Choice(i, want_logprobs, tools) for i in range(n)]


def timings(turn: Turn) -> dict[str, Any]:
    """Server-side clocks, in milliseconds: where this request's time went (an extra field clients ignore)."""
    ctx = turn.ctx
    out: dict[str, Any] = {"gateway_ms": round(ctx.gateway_seconds * 1000, 3)}
    if turn.usage.first_token_at is not None:
        out["ttft_ms"] = round((turn.usage.first_token_at - ctx.started) * 1000, 3)
    finished = turn.usage.finished.get(0)
    if finished:
        t = finished.timings
        out |= {
            "queue_ms": round(t.queue * 1000, 3),
            "tokenize_ms": round(t.tokenize * 1000, 3),
            "prefill_ms": round(t.prefill * 1000, 3),
            "prefill_saved_ms": round(t.prefill_saved * 1000, 3),
            "cached_tokens": finished.cached_tokens,
            "max_batch_size": finished.max_batch_size,
            "decode_ms": round(t.decode * 1000, 3),
            "engine_ttft_ms": round(t.ttft * 1000, 3),
            "mean_itl_ms": None if t.mean_itl is None else round(t.mean_itl * 1000, 3),
            "tokens_per_s": t.decode_tokens_per_s,
            "seed": finished.seed,
        }
    out |= turn.upstream_timings()
    out["total_ms"] = round((time.perf_counter() - ctx.started) * 1000, 3)
    return out


def _envelope(turn: Turn, created: int, kind: str) -> dict[str, Any]:
    """The fields every completion object starts with. The fingerprint names the weights that answered:
    the same seed reproduces only on the same fingerprint."""
    assert turn.ctx.route is not None
    return {
        "id": turn.request_id,
        "object": kind,
        "created": created,
        "model": turn.ctx.route.id,
        "system_fingerprint": turn.fingerprint,
    }


def chunk(
    turn: Turn,
    created: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: list[dict[str, Any]] | None = None,
    index: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    choice = {
        "index": index,
        "delta": delta,
        "logprobs": {"content": logprobs} if logprobs is not None else None,
        "finish_reason": finish_reason,
    }
    return {**_envelope(turn, created, "chat.completion.chunk"), "choices": [choice], **extra}


def sse(data: dict[str, Any] | str) -> bytes:
    """One Server-Sent Event: `data: <json>` and a blank line. Compact UTF-8 JSON, as json.dumps with
    `ensure_ascii=False` writes it, by msgspec in a tenth of the time: an event per streamed token."""
    if isinstance(data, str):
        return f"data: {data}\n\n".encode()
    return b"data: " + msgspec.json.encode(data) + b"\n\n"


def completion(turn: Turn, created: int, choices: list[Choice]) -> dict[str, Any]:
    return {
        **_envelope(turn, created, "chat.completion"),
        "choices": [
            {
                "index": c.index,
                "message": c.message(),
                "logprobs": {"content": c.logprobs} if c.want_logprobs else None,
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": turn.usage.as_openai(),
        "roundtrip_timings": timings(turn),
    }


# --- legacy /v1/completions ---------------------------------------------------------------------


def legacy_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """The legacy logprobs object: parallel lists of tokens, their logprobs, the top alternatives, text offsets."""
    offsets, position = [], offset
    for entry in entries:
        offsets.append(position)
        position += (
            len(bytes(entry["bytes"]).decode("utf-8", errors="ignore"))
            if entry["bytes"] is not None
            else len(entry["token"])
        )
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


def text_choice(choice: Choice, text: str, logprobs: int | None, echo_prefix: str = "") -> dict[str, Any]:
    return {
        "index": choice.index,
        "text": echo_prefix + text,
        "logprobs": legacy_logprobs(choice.logprobs, len(echo_prefix)) if logprobs is not None else None,
        "finish_reason": choice.finish_reason if choice.finished else None,
    }


def text_completion(
    turn: Turn, created: int, choices: list[Choice], logprobs: int | None, echo_prefix: str
) -> dict[str, Any]:
    return {
        **_envelope(turn, created, "text_completion"),
        "choices": [text_choice(c, c.content, logprobs, echo_prefix) for c in choices],
        "usage": turn.usage.as_openai(),
    }


def text_chunk(
    turn: Turn, created: int, choice: Choice, piece: Piece, logprobs: int | None, finish_reason: str | None = None
) -> dict[str, Any]:
    out = {
        "index": choice.index,
        "text": piece.text,
        "logprobs": legacy_logprobs(piece.logprobs, 0) if logprobs is not None else None,
        "finish_reason": finish_reason,
    }
    return {**_envelope(turn, created, "text_completion"), "choices": [out]}
