"""The engine's trace events as wire events: token ids gain their text, arrays become bounded 8-bit rows.

The engine's events (`inference.trace`) carry ids and arrays and know no tokenizer; the worker, which has one,
turns them into `webapp.worker.wire` events for the channel layer, the API and the page.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from inference import trace
from inference.tokenizer import Tokenizer
from webapp.worker import wire

# Full-level attention travels as 8-bit rows (each scaled to its own maximum), over at most this many
# cached positions: the first few (attention sinks) and the most recent. ~140 kB per token at most.
ATTENTION_BUDGET_POSITIONS = 512
ATTENTION_SINK_POSITIONS = 16


def to_wire(event: trace.TraceEvent, tokenizer: Tokenizer) -> wire.TraceEvent:
    """One engine event as its wire event."""
    return CONVERTERS[type(event)](event, tokenizer)


def text_delta(event: trace.TextDelta, tokenizer: Tokenizer) -> wire.TextDelta:
    token = tokenizer.token_text(event.token_id) if event.token_id >= 0 else ""  # -1: the detokenizer's flush
    return wire.TextDelta(
        t=event.t,
        step=event.step,
        token_id=event.token_id,
        token=token,
        text=event.text,
        pending_bytes=list(event.pending_bytes),
        held_text=event.held_text,
    )


def batch_step(event: trace.BatchStep, tokenizer: Tokenizer) -> wire.BatchStep:
    return wire.BatchStep(
        t=event.t,
        step=event.step,
        batch_size=event.batch_size,
        prefill_tokens=event.prefill_tokens,
        decode_tokens=event.decode_tokens,
        duration=event.duration,
        requests=list(event.requests),
    )


def forward_step(event: trace.ForwardStep, tokenizer: Tokenizer) -> wire.ForwardStep:
    detail = layer_detail(event.detail, tokenizer) if event.detail is not None else None
    phase: Literal["prefill", "decode"] = "prefill" if event.phase == "prefill" else "decode"
    return wire.ForwardStep(
        t=event.t,
        step=event.step,
        phase=phase,
        position=event.position,
        n_tokens=event.n_tokens,
        kv_length=event.kv_length,
        duration=event.duration,
        batch_step=event.batch_step,
        detail=detail,
    )


def tokenized(event: trace.Tokenized, tokenizer: Tokenizer) -> wire.Tokenized:
    return wire.Tokenized(
        t=event.t,
        duration=event.duration,
        text=event.text,
        ids=list(event.ids),
        spans=[(a, b) for a, b in event.spans],
        tokens=[tokenizer.token_text(i) for i in event.ids],
        pieces=[tokenizer.pieces[i] for i in event.ids],
        tokenizer=tokenizer.kind,
    )


def context(event: trace.ContextBuilt, tokenizer: Tokenizer) -> wire.ContextBuilt:
    return wire.ContextBuilt(
        t=event.t,
        segments=segments(event.segments),
        prompt_tokens=event.prompt_tokens,
        max_tokens=event.max_tokens,
        context_length=event.context_length,
        dropped_messages=event.dropped_messages,
        rope_base=event.rope_base,
        rope_dim=event.rope_dim,
        n_layers=event.n_layers,
        n_heads=event.n_heads,
        n_kv_heads=event.n_kv_heads,
        cached_tokens=event.cached_tokens,
        dim=event.dim,
        ffn_dim=event.ffn_dim,
        vocab_size=event.vocab_size,
        layer_windows=event.layer_windows,
        local_rope_base=event.local_rope_base,
    )


def sampled(event: trace.Sampled, tokenizer: Tokenizer) -> wire.Sampled:
    text, raw = tokenizer.token_text, tokenizer.token_bytes
    detail = None
    if event.detail is not None:
        d = event.detail
        candidates = [
            wire.Candidate(
                token_id=c.token_id,
                token=text(c.token_id),
                raw_prob=c.raw_prob,
                adjusted_prob=c.adjusted_prob,
                removed_by=c.removed_by,
                final_prob=c.final_prob,
                bias=c.bias,
            )
            for c in d.candidates
        ]
        detail = wire.SamplingDetail(
            candidates=candidates,
            draw=d.draw,
            kept=d.kept,
            eos_prob=d.eos_prob,
            grammar_cut=d.grammar_cut,
            mask_seconds=d.mask_seconds,
        )
    top = [wire.TopLogprob(id=i, token=text(i), logprob=lp, bytes=list(raw[i])) for i, lp in event.top_logprobs]
    return wire.Sampled(
        t=event.t,
        step=event.step,
        token_id=event.token_id,
        token=text(event.token_id),
        bytes=list(raw[event.token_id]),
        logprob=event.logprob,
        rank=event.rank,
        is_stop=event.is_stop,
        duration=event.duration,
        top_logprobs=top,
        detail=detail,
    )


def finished(event: trace.Finished, tokenizer: Tokenizer | None = None) -> wire.Finished:
    t = event.timings
    timings = wire.Timings(
        tokenize=t.tokenize,
        queue=t.queue,
        prefill=t.prefill,
        prefill_saved=t.prefill_saved,
        ttft=t.ttft,
        decode=t.decode,
        total=t.total,
        token_times=list(t.token_times),
        pauses=list(t.pauses),
        mean_itl=t.mean_itl,
        decode_tokens_per_s=t.decode_tokens_per_s,
    )
    reason: Literal["stop", "length"] = "stop" if event.finish_reason == "stop" else "length"
    return wire.Finished(
        t=event.t,
        finish_reason=reason,
        prompt_tokens=event.prompt_tokens,
        completion_tokens=event.completion_tokens,
        seed=event.seed,
        text=event.text,
        timings=timings,
        cached_tokens=event.cached_tokens,
        peers=list(event.peers),
        max_batch_size=event.max_batch_size,
        stop_string=event.stop_string,
    )


def segments(found: list[trace.Segment]) -> list[wire.Segment]:
    return [
        wire.Segment(
            kind=s.kind,
            role=s.role,
            message_index=s.message_index,
            token_start=s.token_start,
            token_end=s.token_end,
            char_start=s.char_start,
            char_end=s.char_end,
        )
        for s in found
    ]


def layer_detail(
    detail: trace.LayerDetail, tokenizer: Tokenizer, budget: int = ATTENTION_BUDGET_POSITIONS
) -> wire.LayerDetail:
    """A forward pass's layer detail: bounded 8-bit attention, residual norms and both halves' updates, the top
    feed-forward neurons, and the logit lens after each half with token text."""

    def lens(guesses: list[trace.LensGuess]) -> list[wire.LensGuess]:
        return [
            wire.LensGuess(layer=g.layer, id=g.token_id, token=tokenizer.token_text(g.token_id), prob=g.prob)
            for g in guesses
        ]

    return wire.LayerDetail(
        attention=attention_rows(detail.attention, budget),
        residual_norms=list(detail.residual_norms),
        attention_update_norms=list(detail.attention_update_norms),
        feed_forward_update_norms=list(detail.feed_forward_update_norms),
        logit_lens=lens(detail.logit_lens),
        logit_lens_after_attention=lens(detail.logit_lens_after_attention),
        top_neurons=[
            [wire.Neuron(index=n.index, gate=n.gate, up=n.up, activation=n.activation) for n in layer]
            for layer in detail.top_neurons
        ],
    )


def attention_rows(attention: np.ndarray, budget: int = ATTENTION_BUDGET_POSITIONS) -> wire.Attention:
    """[layers, heads, positions] weights as base64 uint8 rows within the position budget: the first
    ATTENTION_SINK_POSITIONS and the most recent, each row scaled to its own maximum."""
    layers, heads, length = attention.shape
    if length > budget:
        recent = budget - ATTENTION_SINK_POSITIONS
        positions = list(range(ATTENTION_SINK_POSITIONS)) + list(range(length - recent, length))
        attention = attention[:, :, positions]
    else:
        positions = list(range(length))
    weights = attention.astype(np.float32)
    row_max = np.maximum(weights.max(axis=-1, keepdims=True), 1e-12)  # [layers, heads, 1]
    quantized = np.rint(weights / row_max * 255).astype(np.uint8)
    return wire.Attention(
        shape=[layers, heads, len(positions)],
        kv_length=length,
        positions=positions,
        row_max=np.round(row_max[..., 0].astype(np.float64), 5).tolist(),
        data=base64.b64encode(quantized.tobytes()).decode("ascii"),
    )


CONVERTERS: dict[type, Callable[[Any, Tokenizer], wire.TraceEvent]] = {
    trace.Sampled: sampled,
    trace.TextDelta: text_delta,
    trace.BatchStep: batch_step,
    trace.ForwardStep: forward_step,
    trace.Finished: finished,
    trace.Tokenized: tokenized,
    trace.ContextBuilt: context,
}
