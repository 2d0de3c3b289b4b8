"""Trace events as JSON-safe dicts, with token ids annotated by their text.

The events themselves carry ids and arrays; whoever has the tokenizer (the inference
worker) serializes them for the channel layer, the API and the page. The output uses
only dicts, lists, str, int, float, bool and None, so msgpack (Redis) and JSON both carry it.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import numpy as np

from inference.plain import to_plain
from inference.tokenizer import BPETokenizer
from inference.trace import (
    BatchStep,
    ContextBuilt,
    Finished,
    ForwardStep,
    LayerDetail,
    LensGuess,
    Sampled,
    TextDelta,
    Tokenized,
    TraceEvent,
)

# Full-level attention travels as 8-bit rows (each scaled to its own maximum), over at most this many
# cached positions: the first few (attention sinks) and the most recent. ~140 kB per token at most.
ATTENTION_BUDGET_POSITIONS = 512
ATTENTION_SINK_POSITIONS = 16

EVENT_TYPES: dict[type, str] = {
    Tokenized: "tokenized",
    ContextBuilt: "context",
    BatchStep: "batch",
    ForwardStep: "forward",
    Sampled: "sampled",
    TextDelta: "text",
    Finished: "finished",
}


def event_to_dict(event: TraceEvent, tokenizer: BPETokenizer) -> dict[str, Any]:
    """{"event": <type>, ...fields}; token ids gain their text, arrays become (rounded) lists."""
    data: dict[str, Any] = {"event": EVENT_TYPES[type(event)], **to_plain(event)}
    text = tokenizer.token_text
    raw = tokenizer.token_bytes
    if isinstance(event, Tokenized):
        data["tokens"] = [text(i) for i in event.ids]
    elif isinstance(event, Sampled):
        data["token"] = text(event.token_id)
        data["bytes"] = list(raw[event.token_id])
        data["top_logprobs"] = [
            {"id": i, "token": text(i), "logprob": lp, "bytes": list(raw[i])} for i, lp in event.top_logprobs
        ]
        if data["detail"] is not None:
            for candidate in data["detail"]["candidates"]:
                candidate["token"] = text(candidate["token_id"])
    elif isinstance(event, TextDelta):
        data["token"] = text(event.token_id) if event.token_id >= 0 else ""
    elif isinstance(event, ForwardStep) and event.detail is not None:
        data["detail"] = detail_to_dict(event.detail, tokenizer)
    elif isinstance(event, Finished):
        t = event.timings
        data["timings"]["mean_itl"] = t.mean_itl
        data["timings"]["decode_tokens_per_s"] = t.decode_tokens_per_s
    return data


def detail_to_dict(
    detail: LayerDetail, tokenizer: BPETokenizer, budget: int = ATTENTION_BUDGET_POSITIONS
) -> dict[str, Any]:
    """A forward pass's layer detail: bounded 8-bit attention, residual norms and both halves' updates, the top
    feed-forward neurons, and the logit lens after each half with token text."""

    def lens(guesses: list[LensGuess]) -> list[dict[str, Any]]:
        return [
            {"layer": g.layer, "id": g.token_id, "token": tokenizer.token_text(g.token_id), "prob": g.prob}
            for g in guesses
        ]

    return {
        "attention": attention_to_dict(detail.attention, budget),
        "residual_norms": detail.residual_norms,
        "attention_update_norms": detail.attention_update_norms,
        "feed_forward_update_norms": detail.feed_forward_update_norms,
        "logit_lens": lens(detail.logit_lens),
        "logit_lens_after_attention": lens(detail.logit_lens_after_attention),
        "top_neurons": [[dataclasses.asdict(n) for n in layer] for layer in detail.top_neurons],
    }


def attention_to_dict(attention: np.ndarray, budget: int = ATTENTION_BUDGET_POSITIONS) -> dict[str, Any]:
    """[layers, heads, positions] weights as base64 uint8 rows within the position budget.

    Each row is scaled to its own maximum (`row_max`): weight = byte / 255 * row_max.
    `positions` lists which cached positions the columns are.
    """
    layers, heads, length = attention.shape
    if length > budget:
        recent = budget - ATTENTION_SINK_POSITIONS
        positions = list(range(ATTENTION_SINK_POSITIONS)) + list(range(length - recent, length))
        attention = attention[:, :, positions]
    else:
        positions = list(range(length))
    weights = attention.astype(np.float32)
    row_max = np.maximum(weights.max(axis=-1, keepdims=True), 1e-12)
    quantized = np.rint(weights / row_max * 255).astype(np.uint8)
    return {
        "shape": [layers, heads, len(positions)],
        "kv_length": length,
        "positions": positions,
        "row_max": np.round(row_max[..., 0].astype(np.float64), 5).tolist(),
        "data": base64.b64encode(quantized.tobytes()).decode("ascii"),
    }
