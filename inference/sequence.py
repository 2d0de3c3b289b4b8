"""One request inside the scheduler: what it has computed and generated, its sampler, detokenizer and clocks.

The scheduler decides when a sequence runs and with whom; this object does everything
that concerns the request alone — which tokens it feeds next, turning its row of logits
into a token, text and trace events, deciding when it is finished, and its timings —
so all of that is tested without a model (feed it logits by hand).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from torch import Tensor

from inference.detokenizer import IncrementalDetokenizer
from inference.grammar import Grammar
from inference.params import SamplingParams
from inference.sampling import RowSummary, Sampler
from inference.trace import (
    BatchStep,
    ContextBuilt,
    Finished,
    ForwardStep,
    LayerDetail,
    Sampled,
    TextDelta,
    Timings,
    TraceEvent,
    TraceLevel,
)

DETAIL_TOP_N = 10  # candidates explained per sampling decision at summary level and above


class Phase(str, Enum):
    WAITING = "waiting"  # queued for a slot
    PREFILL = "prefill"  # has a slot; prompt not fully in the cache yet
    DECODE = "decode"
    DONE = "done"


@dataclass(frozen=True)
class SequenceRequest:
    """What the scheduler is asked to run: prompt ids and sampling settings (the seed already resolved)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    level: TraceLevel = TraceLevel.OFF
    step_mode: bool = False  # pause after every token until resumed
    received_at: float = field(default_factory=time.perf_counter)  # when the request reached the worker
    tokenize_seconds: float = 0.0
    context: ContextBuilt | None = None  # the context event to complete with the cache hit at admission
    grammar: Grammar | None = None  # structured output: only tokens this grammar allows are drawn
    # another choice of the same request (n > 1): its prompt's cache is copied, not recomputed
    shares_prompt_with: str | None = None


class SequenceState:
    def __init__(
        self, request: SequenceRequest, vocab_size: int, stop_ids: frozenset[int], token_bytes: Sequence[bytes]
    ) -> None:
        self.request = request
        self.request_id = request.request_id
        self.params = request.params
        self.traced = request.level != TraceLevel.OFF
        self.sampler = Sampler(request.params, vocab_size, request.prompt_ids, stop_ids)
        self.detokenizer = IncrementalDetokenizer(token_bytes, request.params.stop)
        self.stop_ids = stop_ids
        self.phase = Phase.WAITING
        self.slot: int | None = None
        self.computed = 0  # positions whose keys and values are in the cache
        self.cached_tokens = 0  # of them, taken from the prefix cache
        self.generated: list[int] = []
        self.text: list[str] = []
        self.paused = False
        self.paused_at = 0.0  # when step mode paused it
        self.pause_in_gap = 0.0  # seconds paused since the last token
        self.pauses: list[float] = []  # per gap between tokens: the seconds paused in it
        self.finish_reason: str | None = None
        self.peers: set[str] = set()
        self.max_batch_size = 0
        self.enqueued_at = time.perf_counter()
        self.admitted_at: float | None = None
        self.prefill_started: float | None = None
        self.prefill_ended: float | None = None
        self.token_times: list[float] = []  # seconds since the request reached the worker

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def reserve(self) -> int:
        """The most cache positions this sequence can ever need: its prompt and every token it may generate."""
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def ids(self) -> list[int]:
        """Prompt and generated tokens so far."""
        return self.prompt_ids + self.generated

    def admit(self, slot: int, cached_tokens: int, now: float) -> list[TraceEvent]:
        """Given a cache slot, with the first `cached_tokens` positions already filled from the prefix cache."""
        self.slot, self.computed, self.cached_tokens = slot, cached_tokens, cached_tokens
        self.phase, self.admitted_at = Phase.PREFILL, now
        context = self.request.context
        if not self.traced or context is None:
            return []
        return [dataclasses.replace(context, t=now, cached_tokens=cached_tokens)]

    def next_tokens(self, budget: int) -> list[int]:
        """The tokens to feed in the next forward: up to `budget` of the prompt, or the last generated token."""
        if self.phase == Phase.PREFILL:
            return self.prompt_ids[self.computed : self.computed + budget]
        return self.generated[-1:]

    def forwarded(
        self, batch: BatchStep, n_tokens: int, started: float, detail: LayerDetail | None
    ) -> list[TraceEvent]:
        """This sequence's part of a batched forward ran: `n_tokens` more positions are in the cache."""
        prefill = self.phase == Phase.PREFILL
        position = self.computed
        self.computed += n_tokens
        self.peers.update(batch.requests)
        self.max_batch_size = max(self.max_batch_size, batch.batch_size)
        if prefill:
            self.prefill_started = self.prefill_started if self.prefill_started is not None else started
            if self.computed == len(self.prompt_ids):
                self.prefill_ended, self.phase = batch.t, Phase.DECODE
        if not self.traced:
            return []
        step = ForwardStep(
            t=batch.t,
            step=0 if prefill else len(self.generated),
            phase="prefill" if prefill else "decode",
            position=position,
            n_tokens=n_tokens,
            kv_length=self.computed,
            duration=batch.duration,
            batch_step=batch.step,
            detail=detail,
        )
        return [batch, step]

    def sample(self, logits: Tensor, summary: RowSummary | None = None) -> list[TraceEvent]:
        """Pick the next token from this sequence's float32 logits [V] (and their summary, when the step made one for
        every row); its events, and Finished when it is done."""
        started = time.perf_counter()
        grammar = self.request.grammar
        allowed = grammar.allowed() if grammar is not None else None
        sample = self.sampler.sample(logits, DETAIL_TOP_N if self.traced else 0, allowed, summary)
        if grammar is not None:
            grammar.advance(sample.token_id)
            if sample.detail is not None:
                sample = dataclasses.replace(
                    sample, detail=dataclasses.replace(sample.detail, mask_seconds=grammar.mask_seconds)
                )
        now = time.perf_counter()
        is_stop = sample.token_id in self.stop_ids
        self.generated.append(sample.token_id)
        if self.token_times:
            self.pauses.append(self.pause_in_gap)
        self.pause_in_gap = 0.0
        self.token_times.append(now - self.request.received_at)
        events: list[TraceEvent] = [
            Sampled(
                now,
                len(self.generated),
                sample.token_id,
                sample.logprob,
                sample.rank,
                is_stop,
                now - started,
                sample.top_logprobs,
                sample.detail,
            )
        ]
        if is_stop and not self.params.ignore_eos:
            return events + self._finish("stop")
        if not is_stop:
            delta = self.detokenizer.push(sample.token_id)
            self.text.append(delta.text)
            if self.traced or delta.text:
                events.append(
                    TextDelta(
                        time.perf_counter(),
                        len(self.generated),
                        sample.token_id,
                        delta.text,
                        delta.pending_bytes,
                        delta.held_text,
                    )
                )
            if delta.stopped:
                return events + self._finish("stop")
        if len(self.generated) >= self.params.max_tokens:
            return events + self._finish("length")
        if self.request.step_mode:
            self.paused, self.paused_at = True, time.perf_counter()
        return events

    def resume(self) -> None:
        """Step mode's "next": take part in steps again; the wait is a pause, not latency."""
        if self.paused:
            self.paused = False
            self.pause_in_gap += time.perf_counter() - self.paused_at

    def _finish(self, reason: str) -> list[TraceEvent]:
        self.finish_reason, self.phase = reason, Phase.DONE
        events: list[TraceEvent] = []
        tail = self.detokenizer.flush()
        if tail.text:
            self.text.append(tail.text)
            events.append(TextDelta(time.perf_counter(), len(self.generated), -1, tail.text, b"", ""))
        ended = time.perf_counter()
        received = self.request.received_at
        times = self.token_times
        prefill = (self.prefill_ended or ended) - (self.prefill_started or ended)
        computed_prompt = len(self.prompt_ids) - self.cached_tokens
        events.append(
            Finished(
                t=ended,
                finish_reason=reason,
                prompt_tokens=len(self.prompt_ids),
                completion_tokens=len(self.generated),
                seed=self.params.seed if self.params.seed is not None else 0,
                text="".join(self.text),
                timings=Timings(
                    tokenize=self.request.tokenize_seconds,
                    queue=(self.admitted_at or ended) - self.enqueued_at,
                    prefill=prefill,
                    prefill_saved=self.cached_tokens * prefill / computed_prompt if computed_prompt else 0.0,
                    ttft=times[0] if times else ended - received,
                    decode=(times[-1] - times[0] - sum(self.pauses)) if times else 0.0,
                    total=ended - received,
                    token_times=list(times),
                    pauses=list(self.pauses) if any(self.pauses) else [],
                ),
                cached_tokens=self.cached_tokens,
                peers=sorted(self.peers - {self.request_id}),
                stop_string=self.detokenizer.matched,
                max_batch_size=self.max_batch_size,
            )
        )
        return events
