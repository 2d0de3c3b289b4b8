"""Turning the worker's trace events into OpenAI chat-completion objects: chunks, the whole message, usage."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from webapp.gateway.gateway import RequestContext


@dataclass
class Piece:
    """Text to send, with the log-probabilities of the tokens that produced it."""

    text: str
    logprobs: list[dict[str, Any]]


@dataclass
class Assembler:
    """Consumes trace events in order; a token's logprobs travel with the text it released."""

    want_logprobs: bool
    prompt_tokens: int = 0  # from the worker's "accepted" reply, for requests that never finish
    sampled: int = 0
    pending: list[dict[str, Any]] = field(default_factory=list)
    finished: dict[str, Any] | None = None
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    first_token_at: float | None = None

    def feed(self, event: dict[str, Any]) -> Piece | None:
        kind = event["event"]
        if kind == "sampled":
            self.sampled += 1
            if self.first_token_at is None:
                self.first_token_at = time.perf_counter()
            if self.want_logprobs and not event["is_stop"]:
                self.pending.append(
                    {
                        "token": event["token"],
                        "logprob": event["logprob"],
                        "bytes": event["bytes"],
                        "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]} for t in event["top_logprobs"]],
                    }
                )
            return None
        if kind == "text" or (kind == "finished" and self.pending):
            piece = Piece(event.get("text", "") if kind == "text" else "", self.pending)
            self.pending = []
            self.text.append(piece.text)
            self.logprobs.extend(piece.logprobs)
            if kind == "finished":
                self.finished = event
            return piece if piece.text or piece.logprobs else None
        if kind == "finished":
            self.finished = event
        return None

    @property
    def finish_reason(self) -> str:
        return self.finished["finish_reason"] if self.finished else "cancelled"

    def usage(self) -> dict[str, Any]:
        """The finished event's counts, as OpenAI reports them; for a request cut short, what it had used so far."""
        prompt = self.finished["prompt_tokens"] if self.finished else self.prompt_tokens
        completion = self.finished["completion_tokens"] if self.finished else self.sampled
        cached = self.finished["cached_tokens"] if self.finished else 0
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}


def timings(ctx: RequestContext, assembler: Assembler) -> dict[str, Any]:
    """Server-side clocks, in milliseconds: where this request's time went (an extra field clients ignore)."""
    out: dict[str, Any] = {"gateway_ms": round(ctx.gateway_seconds * 1000, 3)}
    if assembler.first_token_at is not None:
        out["ttft_ms"] = round((assembler.first_token_at - ctx.started) * 1000, 3)
    if assembler.finished:
        t = assembler.finished["timings"]
        out |= {
            "queue_ms": round(t["queue"] * 1000, 3),
            "tokenize_ms": round(t["tokenize"] * 1000, 3),
            "prefill_ms": round(t["prefill"] * 1000, 3),
            "prefill_saved_ms": round(t["prefill_saved"] * 1000, 3),
            "cached_tokens": assembler.finished["cached_tokens"],
            "max_batch_size": assembler.finished["max_batch_size"],
            "decode_ms": round(t["decode"] * 1000, 3),
            "engine_ttft_ms": round(t["ttft"] * 1000, 3),
            "mean_itl_ms": None if t["mean_itl"] is None else round(t["mean_itl"] * 1000, 3),
            "tokens_per_s": t["decode_tokens_per_s"],
            "seed": assembler.finished["seed"],
        }
    out["total_ms"] = round((time.perf_counter() - ctx.started) * 1000, 3)
    return out


def _envelope(ctx: RequestContext, created: int, kind: str) -> dict[str, Any]:
    """The fields every chat.completion and chat.completion.chunk object starts with."""
    assert ctx.route is not None
    return {"id": ctx.request_id, "object": kind, "created": created, "model": ctx.route.id, "system_fingerprint": None}


def chunk(ctx: RequestContext, created: int, delta: dict[str, Any], finish_reason: str | None = None, logprobs: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": {"content": logprobs} if logprobs is not None else None, "finish_reason": finish_reason}
    return {**_envelope(ctx, created, "chat.completion.chunk"), "choices": [choice], **extra}


def sse(data: dict[str, Any] | str) -> bytes:
    """One Server-Sent Event: `data: <json>` and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


def completion(ctx: RequestContext, created: int, assembler: Assembler) -> dict[str, Any]:
    return {
        **_envelope(ctx, created, "chat.completion"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(assembler.text), "refusal": None},
                "logprobs": {"content": assembler.logprobs} if assembler.want_logprobs else None,
                "finish_reason": assembler.finish_reason,
            }
        ],
        "usage": assembler.usage(),
        "roundtrip_timings": timings(ctx, assembler),
    }
