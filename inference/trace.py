"""The trace: typed events, one per pipeline stage, each stamped with a monotonic clock.

Events carry the numbers the model really computed, as token ids and arrays; turning
ids into text for a page is the worker's job (`webapp.worker.serialize`, into `webapp.worker.wire`'s events). `t` is
`time.perf_counter()` seconds on the server.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from inference.chat_template import Segment


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
class Candidate:
    """One of the most likely next tokens, and what the sampler's filters made of it."""

    token_id: int
    raw_prob: float  # the model's own softmax
    adjusted_prob: float  # after penalties and temperature
    removed_by: str | None  # "top_k", "top_p", "min_p", "grammar", "greedy" or None (kept)
    final_prob: float  # renormalised over the kept tokens: the chance it was drawn
    bias: float = 0.0  # the request's logit_bias for this token, added before everything else


@dataclass(frozen=True)
class SamplingDetail:
    """The sampling decision in full, for the trace at `summary` level and above."""

    candidates: list[Candidate]
    draw: float | None  # the uniform number in [0, 1) that picked the token; None when greedy
    kept: int  # tokens left after the filters
    eos_prob: float  # raw probability of ending the turn now
    grammar_cut: int = 0  # tokens the request's grammar (structured output, forced tool call) removed
    mask_seconds: float = 0.0  # what computing that grammar's mask cost


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
    rope_base: float  # the model's rotary position embedding: dimension pair i of a query or key at position p
    rope_dim: int  # is rotated by the angle p * rope_base ** (-2i / rope_dim); rope_dim dimensions of each head rotate
    n_layers: int  # the model's shape, so the page draws any model's layers and heads without knowing it in advance
    n_heads: int
    n_kv_heads: int  # key/value heads: n_heads / n_kv_heads query heads share each
    cached_tokens: int = 0  # positions 0..cached_tokens-1 came from the prefix cache, not a forward pass
    dim: int = 0  # the width of the residual stream: the numbers each token is carried as
    ffn_dim: int = 0  # feed-forward neurons per layer
    vocab_size: int = 0  # tokens the output head scores
    # positions each layer sees (0: all of them; Gemma 3's local layers: the last `sliding_window`), and their RoPE base
    layer_windows: list[int] = field(default_factory=list)
    local_rope_base: float = 0.0


@dataclass(frozen=True)
class LensGuess:
    """The logit lens at one point of the residual stream: its top token read through the final norm and head."""

    layer: int
    token_id: int
    prob: float


@dataclass(frozen=True)
class Neuron:
    """One feed-forward (SwiGLU) neuron for one token: silu(gate) says how far the gate opened, `up` what it lets
    through; their product `activation` is what the down projection receives from this neuron."""

    index: int
    gate: float  # silu(gate projection)
    up: float
    activation: float  # gate * up


@dataclass(frozen=True)
class LayerDetail:
    """Inside the forward pass for the newest token (`full` level).

    attention: [layers, heads, kv_len] float16 weights of the newest query over every cached position;
    residual_norms: L2 norm of the residual stream entering each layer, then after the last one;
    logit_lens: the top guess after each layer looked at (live: a few evenly spaced ones and the last;
    recomputed on demand: every layer); logit_lens_after_attention: the same layers' guesses halfway, after
    the attention half and before the feed-forward half.
    attention_update_norms / feed_forward_update_norms: per layer, the L2 norm of what each half added to the
    residual stream (a layer is h -> h + attention(h) = m -> m + feed_forward(m));
    top_neurons: per layer, the feed-forward neurons with the largest |activation|, largest first.
    """

    attention: np.ndarray
    residual_norms: list[float]
    logit_lens: list[LensGuess]
    attention_update_norms: list[float]
    feed_forward_update_norms: list[float]
    logit_lens_after_attention: list[LensGuess]
    top_neurons: list[list[Neuron]]


@dataclass(frozen=True)
class BatchStep:
    """One engine step: a single batched forward for every running sequence, shared by all of them.

    Each request in the step gets the same event before its own ForwardStep, so its trace
    says with whom it was computed and what the step as a whole cost.
    """

    t: float
    step: int  # the engine's step counter since the worker started
    batch_size: int  # sequences in this forward
    prefill_tokens: int  # prompt tokens of newcomers, in chunks
    decode_tokens: int  # one per decoding sequence
    duration: float
    requests: list[str]  # the request ids in this forward


@dataclass(frozen=True)
class ForwardStep:
    """This request's part of one batched forward: a chunk of its prompt (prefill) or one decode token."""

    t: float
    step: int  # 0 = prefill (possibly in several chunks), n = the pass that consumed the n-th generated token
    phase: str  # "prefill" | "decode"
    position: int  # first position written
    n_tokens: int
    kv_length: int  # cached positions after the pass
    duration: float  # of the whole batched forward this part ran in
    batch_step: int = 0  # the BatchStep it ran in
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
    queue: float  # waiting for a slot in the running batch
    prefill: float  # from the first prompt chunk's forward to the end of the last
    prefill_saved: float  # estimated: cached prompt tokens at this request's own measured prefill rate
    ttft: float
    decode: float
    total: float
    token_times: list[float]
    # Seconds of each gap between tokens the sequence spent paused in step mode (waiting for its reader's "next"):
    # not latency, so the gaps below leave them out. Empty: no pause.
    pauses: list[float] = field(default_factory=list)

    @property
    def inter_token_latencies(self) -> list[float]:
        """The gaps between tokens, less the time paused in them."""
        pauses = self.pauses or [0.0] * max(0, len(self.token_times) - 1)
        return [b - a - p for (a, b), p in zip(itertools.pairwise(self.token_times), pauses, strict=True)]

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
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache
    peers: list[str] = field(default_factory=list)  # other requests it shared a batched forward with
    max_batch_size: int = 1
    stop_string: str | None = None  # the request's stop string that ended it, when one did


TraceEvent = Tokenized | ContextBuilt | BatchStep | ForwardStep | Sampled | TextDelta | Finished
