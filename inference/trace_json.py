"""Trace events as JSON-safe dicts, with token ids annotated by their text.

The events themselves carry ids and arrays; whoever has the tokenizer (the inference
worker) serializes them for the channel layer, the API and the page. The output uses
only dicts, lists, str, int, float, bool and None, so msgpack (Redis) and JSON both carry it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from inference.tokenizer import BPETokenizer
from inference.trace import ContextBuilt, Finished, ForwardStep, Sampled, TextDelta, Tokenized, TraceEvent

EVENT_TYPES: dict[type, str] = {
    Tokenized: "tokenized",
    ContextBuilt: "context",
    ForwardStep: "forward",
    Sampled: "sampled",
    TextDelta: "text",
    Finished: "finished",
}


def event_to_dict(event: TraceEvent, tokenizer: BPETokenizer) -> dict[str, Any]:
    """{"event": <type>, ...fields}; token ids gain their text, arrays become (rounded) lists."""
    data: dict[str, Any] = {"event": EVENT_TYPES[type(event)], **_plain(dataclasses.asdict(event))}
    text = tokenizer.token_text
    raw = tokenizer.token_bytes
    if isinstance(event, Tokenized):
        data["tokens"] = [text(i) for i in event.ids]
    elif isinstance(event, Sampled):
        data["token"] = text(event.token_id)
        data["bytes"] = list(raw[event.token_id])
        data["top_logprobs"] = [{"id": i, "token": text(i), "logprob": lp, "bytes": list(raw[i])} for i, lp in event.top_logprobs]
        if data["detail"] is not None:
            for candidate in data["detail"]["candidates"]:
                candidate["token"] = text(candidate["token_id"])
    elif isinstance(event, TextDelta):
        data["token"] = text(event.token_id) if event.token_id >= 0 else ""
    elif isinstance(event, ForwardStep) and data["detail"] is not None:
        data["detail"]["logit_lens"] = [{"id": i, "token": text(i), "prob": p} for i, p in event.detail.logit_lens]  # type: ignore[union-attr]
    elif isinstance(event, Finished):
        t = event.timings
        data["timings"]["mean_itl"] = t.mean_itl
        data["timings"]["decode_tokens_per_s"] = t.decode_tokens_per_s
    return data


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return np.round(value.astype(np.float64), 4).tolist()
    if isinstance(value, bytes):
        return list(value)
    return value
