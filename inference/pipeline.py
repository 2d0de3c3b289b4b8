"""One chat request, end to end: template and tokenize, build the context, run the engine, detokenize.

`prepare` does everything that can reject a request (bad messages, impossible sampling
values, a context that does not fit) before anything is streamed, so an API can answer
with a plain error; `stream` then yields the trace events.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass
from typing import Generator, Sequence

from inference.chat_template import Message, Prompt
from inference.detokenizer import IncrementalDetokenizer
from inference.engine import Engine
from inference.errors import ContextLengthExceededError
from inference.loader import LoadedModel
from inference.sampling import SamplingParams
from inference.trace import (
    ContextBuilt,
    Finished,
    ForwardStep,
    Sampled,
    TextDelta,
    Timings,
    Tokenized,
    TraceEvent,
    TraceLevel,
)


@dataclass(frozen=True)
class PreparedRequest:
    """A request that passed every check: its prompt, its resolved parameters, its clocks so far."""

    prompt: Prompt
    params: SamplingParams  # with the seed resolved, so the run can be repeated
    dropped_messages: int
    received_at: float
    tokenize_seconds: float


class ChatPipeline:
    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.engine = Engine(loaded.model, loaded.stop_ids)

    def prepare(
        self,
        messages: Sequence[Message],
        params: SamplingParams,
        truncate_history: bool = False,
        received_at: float | None = None,
        fit_max_tokens: bool = False,
    ) -> PreparedRequest:
        """Validate and tokenize; raises InvalidRequestError (or ContextLengthExceededError) on a bad request.

        With truncate_history, the oldest turns after the system prompt are dropped until
        the prompt fits (the newest message always stays); the count is reported. With
        fit_max_tokens (max_tokens was a default, not the client's), max_tokens shrinks to
        the room left in the context instead of failing.
        """
        received = received_at if received_at is not None else time.perf_counter()
        params.validate()
        if params.seed is None:
            params = dataclasses.replace(params, seed=secrets.randbits(63))
        limit = self.loaded.config.context_length
        started = time.perf_counter()
        kept = list(messages)
        dropped = 0
        while True:
            prompt = self.loaded.chat_template.render(kept)
            if fit_max_tokens and len(prompt.ids) < limit:
                params = dataclasses.replace(params, max_tokens=min(params.max_tokens, limit - len(prompt.ids)))
            fits = len(prompt.ids) + params.max_tokens <= limit
            first_turn = 1 if kept and kept[0]["role"] == "system" else 0
            if fits or not truncate_history or len(kept) - first_turn <= 1:
                break
            del kept[first_turn]
            dropped += 1
        if not fits:
            raise ContextLengthExceededError(len(prompt.ids), params.max_tokens, limit)
        return PreparedRequest(prompt, params, dropped, received, time.perf_counter() - started)

    def stream(
        self, request: PreparedRequest, level: TraceLevel = TraceLevel.OFF
    ) -> Generator[TraceEvent, None, None]:
        """Yield the request's trace; at `off`, only Sampled (without detail), TextDelta and Finished events."""
        prompt, params = request.prompt, request.params
        traced = level != TraceLevel.OFF
        if traced:
            now = time.perf_counter()
            yield Tokenized(now, request.tokenize_seconds, prompt.text, prompt.ids, prompt.spans)
            yield ContextBuilt(
                now, prompt.segments, len(prompt.ids), params.max_tokens, self.loaded.config.context_length, request.dropped_messages
            )
        detok = IncrementalDetokenizer(self.loaded.tokenizer.token_bytes, params.stop)
        text: list[str] = []
        token_times: list[float] = []
        prefill_seconds = 0.0
        finish_reason = "length"
        for event in self.engine.generate(prompt.ids, params, level):
            if isinstance(event, ForwardStep):
                prefill_seconds = event.duration if event.phase == "prefill" else prefill_seconds
                yield event
                continue
            assert isinstance(event, Sampled)
            token_times.append(event.t - request.received_at)
            if len(token_times) == 1 and not traced:
                prefill_seconds = event.t - request.received_at - request.tokenize_seconds
            yield event
            if event.is_stop:
                finish_reason = "stop"
                break
            delta = detok.push(event.token_id)
            text.append(delta.text)
            if traced or delta.text:
                yield TextDelta(time.perf_counter(), event.step, event.token_id, delta.text, delta.pending_bytes, delta.held_text)
            if delta.stopped:
                finish_reason = "stop"
                break
        tail = detok.flush()
        if tail.text:
            text.append(tail.text)
            yield TextDelta(time.perf_counter(), len(token_times), -1, tail.text, b"", "")
        ended = time.perf_counter()
        ttft = token_times[0] if token_times else ended - request.received_at
        yield Finished(
            t=ended,
            finish_reason=finish_reason,
            prompt_tokens=len(prompt.ids),
            completion_tokens=len(token_times),
            seed=params.seed if params.seed is not None else 0,
            text="".join(text),
            timings=Timings(
                tokenize=request.tokenize_seconds,
                prefill=prefill_seconds,
                ttft=ttft,
                decode=(token_times[-1] - token_times[0]) if token_times else 0.0,
                total=ended - request.received_at,
                token_times=token_times,
            ),
        )
