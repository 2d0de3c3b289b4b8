"""The trace: typed events, one per pipeline stage, each stamped with a monotonic clock.

Events carry the numbers the model really computed, as token ids and arrays; turning
ids into text for a page is the serializer's job (`inference.trace_json`). `t` is
`time.perf_counter()` seconds on the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from inference.chat_template import Segment
from inference.sampling import SamplingDetail


class TraceLevel(str, Enum):
    """How much a request's trace records.

    off: only what the answer needs (tokens, text, finish); summary: plus tokenization,
    context, per-step timings and sampling decisions; full: plus attention rows, residual
    norms and logit-lens guesses for the newest token in every layer.
    """

    OFF = "off"
    SUMMARY = "summary"
    FULL = "full"


@dataclass(frozen=True)
class Tokenized:
    """The prompt after the chat template: its text and tokens, with each token's span in the text."""

    t: float
    duration: float
    text: str
    ids: list[int]
    spans: list[tuple[int, int]]


@dataclass(frozen=True)
class ContextBuilt:
    """What fills the context window: segments, and how full it is."""

    t: float
    segments: list[Segment]
    prompt_tokens: int
    max_tokens: int
    context_length: int
    dropped_messages: int  # earlier turns left out to fit (only when the request allowed it)


@dataclass(frozen=True)
class LayerDetail:
    """Inside the forward pass for the newest token (`full` level).

    attention: [layers, heads, kv_len] float16 weights of the newest query over every cached position;
    residual_norms: L2 norm of the residual stream entering each layer, then after the last one;
    logit_lens: per layer, (token id, probability) of the top guess read through the final norm and head.
    """

    attention: np.ndarray
    residual_norms: list[float]
    logit_lens: list[tuple[int, float]]


@dataclass(frozen=True)
class ForwardStep:
    """One forward pass: the prefill of the whole prompt, or one decode step."""

    t: float
    step: int  # 0 = prefill, n = the pass that consumed the n-th generated token
    phase: str  # "prefill" | "decode"
    position: int  # first position written
    n_tokens: int
    kv_length: int  # cached positions after the pass
    duration: float
    detail: LayerDetail | None = None


@dataclass(frozen=True)
class Sampled:
    """The token chosen after a forward pass."""

    t: float
    step: int  # 1-based index of the generated token
    token_id: int
    logprob: float
    rank: int
    is_stop: bool
    duration: float
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)
    detail: SamplingDetail | None = None


@dataclass(frozen=True)
class TextDelta:
    """Detokenization of one token: the text it released, bytes still waiting, text held for stop strings."""

    t: float
    step: int
    token_id: int
    text: str
    pending_bytes: bytes
    held_text: str


@dataclass(frozen=True)
class Timings:
    """Where the time went, in seconds; token_times are seconds since the request arrived."""

    tokenize: float
    prefill: float
    ttft: float
    decode: float
    total: float
    token_times: list[float]

    @property
    def inter_token_latencies(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def mean_itl(self) -> float | None:
        gaps = self.inter_token_latencies
        return sum(gaps) / len(gaps) if gaps else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        gaps = self.inter_token_latencies
        return len(gaps) / sum(gaps) if gaps and sum(gaps) > 0 else None


@dataclass(frozen=True)
class Finished:
    """The end of a request: why it stopped, the usage counts and the timings."""

    t: float
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    seed: int
    text: str
    timings: Timings


TraceEvent = Tokenized | ContextBuilt | ForwardStep | Sampled | TextDelta | Finished
