"""One chat request, end to end: template and tokenize, build the context, then hand it to the scheduler.

`prepare` does everything that can reject a request (bad messages, impossible sampling
values, a context that does not fit) before anything is streamed, so an API can answer
with a plain error, and needs no torch; `sequence_request` turns the result into what
the scheduler runs; `stream` runs one request alone and yields its trace events.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inference.chat_template import Message, Prompt
from inference.engine import Engine
from inference.errors import ContextLengthExceededError, InvalidRequestError, PromptFarTooLongError
from inference.grammar import Grammar
from inference.loader import LoadedModel
from inference.params import SamplingParams
from inference.scheduler import SchedulerConfig
from inference.sequence import SequenceRequest
from inference.trace import ContextBuilt, Tokenized, TraceEvent, TraceLevel


@dataclass(frozen=True)
class PreparedRequest:
    """A request that passed every check: its prompt, its resolved parameters, its clocks so far."""

    prompt: Prompt
    params: SamplingParams  # with the seed resolved, so the run can be repeated
    dropped_messages: int
    received_at: float
    tokenize_seconds: float
    grammar: Grammar | None = None  # built from params.grammar: structured output or a forced tool call


class ChatPipeline:
    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        # characters one token can spell, at most
        self._longest_token = max((len(b) for b in loaded.tokenizer.token_bytes), default=1)

    def prepare(
        self,
        messages: Sequence[Message],
        params: SamplingParams,
        truncate_history: bool = False,
        received_at: float | None = None,
        fit_max_tokens: bool = False,
        text: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        continue_final: bool = False,
    ) -> PreparedRequest:
        """Validate and tokenize; raises InvalidRequestError (or ContextLengthExceededError) on a bad request.

        `text` instead of messages: a raw prompt, without the chat template (legacy completions).
        `tools`: function definitions the model may call, shown to it as its template (or `inference.tool_prompt`) says.
        `continue_final`: the last message is the assistant's unfinished answer, which generation continues.

        With truncate_history, the oldest turns after the system prompt are dropped until
        the prompt fits (the newest message always stays); the count is reported. With
        fit_max_tokens (max_tokens was a default, not the client's), max_tokens shrinks to
        the room left in the context instead of failing.
        """
        received = received_at if received_at is not None else time.perf_counter()
        params.validate(self.loaded.config.vocab_size)
        if params.seed is None:
            params = dataclasses.replace(params, seed=secrets.randbits(63))
        limit = self.loaded.config.context_length
        if not truncate_history:
            self._within_reach(messages, text, limit, tools)
        started = time.perf_counter()
        first = 1 if messages and messages[0]["role"] == "system" else 0

        def attempt(drop: int) -> tuple[Prompt, SamplingParams, bool]:
            """The prompt without the `drop` oldest turns after the system prompt, its parameters, and whether it
            fits."""
            if text is not None:
                prompt = self.loaded.chat_template.plain(text)
            else:
                prompt = self.loaded.chat_template.render(
                    [*messages[:first], *messages[first + drop :]], tools=tools, continue_final=continue_final
                )
            fitted = params
            if fit_max_tokens and len(prompt.ids) < limit:
                fitted = dataclasses.replace(params, max_tokens=min(params.max_tokens, limit - len(prompt.ids)))
            return prompt, fitted, len(prompt.ids) + fitted.max_tokens <= limit

        prompt, params, fits = attempt(0)
        _require_tokens(prompt)
        dropped = 0
        droppable = len(messages) - first - 1  # the newest message always stays
        if not fits and truncate_history and text is None and droppable > 0:
            dropped = _fewest(lambda drop: attempt(drop)[2], droppable)
            prompt, params, fits = attempt(dropped)
        if not fits:
            raise ContextLengthExceededError(len(prompt.ids), params.max_tokens, limit)
        grammar = self._grammar(params.grammar) if params.grammar else None
        return PreparedRequest(prompt, params, dropped, received, time.perf_counter() - started, grammar)

    def _within_reach(
        self, messages: Sequence[Message], text: str | None, limit: int, tools: Sequence[Mapping[str, Any]] | None
    ) -> None:
        """Refuse at once, before any rendering or tokenizing, what cannot fit whatever the tokenization: each message
        takes at least one token, and no token spells more characters than the longest in the vocabulary. The tools'
        descriptions count too: every template that shows tools to the model shows those."""
        if text is None and len(messages) > limit:
            raise PromptFarTooLongError(f"{len(messages)} messages", limit)
        longest = self._longest_token
        chars = len(text) if text is not None else sum(len(m.get("content") or "") for m in messages)
        chars += sum(len(str(tool.get("description") or "")) for tool in tools or ())
        if chars > limit * longest:
            raise PromptFarTooLongError(f"{chars} characters", limit)

    def _grammar(self, lark: str) -> Grammar:
        """The request's matcher (built here, off the engine thread: compiling a schema takes up to milliseconds)."""
        stops = self.loaded.stop_ids
        # the turn's end, else any stop token
        eos = min(stops, key=lambda i: self.loaded.tokenizer.pieces[i] != "<|im_end|>")
        return Grammar(lark, self.loaded.tokenizer, eos, sorted(stops))

    def sequence_request(
        self, request: PreparedRequest, request_id: str, level: TraceLevel = TraceLevel.OFF, step_mode: bool = False
    ) -> SequenceRequest:
        """The scheduler's view of a prepared request: ids and parameters, plus the context event to complete."""
        prompt = request.prompt
        c = self.loaded.config
        context = ContextBuilt(
            time.perf_counter(),
            prompt.segments,
            len(prompt.ids),
            request.params.max_tokens,
            c.context_length,
            request.dropped_messages,
            c.rope_base,
            c.rope_dim,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            dim=c.dim,
            ffn_dim=c.ffn_dim,
            vocab_size=c.vocab_size,
            layer_windows=[c.window(i) for i in range(c.n_layers)],
            local_rope_base=c.local_rope_base,
        )
        return SequenceRequest(
            request_id,
            list(prompt.ids),
            request.params,
            level,
            step_mode,
            request.received_at,
            request.tokenize_seconds,
            context,
            request.grammar,
        )

    def sequence_requests(
        self,
        request: PreparedRequest,
        request_id: str,
        n: int = 1,
        level: TraceLevel = TraceLevel.OFF,
        step_mode: bool = False,
    ) -> list[SequenceRequest]:
        """`n` choices of one request: the first as `sequence_request` makes it; each other one (id "<id>#<i>") with
        seed + i, its own grammar matcher, and the first choice's prompt cache to start from."""
        first = self.sequence_request(request, request_id, level, step_mode)
        seed = request.params.seed or 0
        others = [
            dataclasses.replace(
                first,
                request_id=f"{request_id}#{i}",
                params=dataclasses.replace(request.params, seed=(seed + i) % 2**64),
                grammar=self._grammar(request.params.grammar) if request.params.grammar else None,
                shares_prompt_with=request_id,
            )
            for i in range(1, n)
        ]
        return [first, *others]

    @staticmethod
    def tokenized(request: PreparedRequest) -> Tokenized:
        """The first trace event of a request: the prompt as the model will see it."""
        prompt = request.prompt
        return Tokenized(time.perf_counter(), request.tokenize_seconds, prompt.text, prompt.ids, prompt.spans)

    def stream(self, request: PreparedRequest, level: TraceLevel = TraceLevel.OFF) -> Generator[TraceEvent, None, None]:
        """Run one request alone (a batch of one) and yield its trace; for the CLI, benchmarks and tests.

        At `off`, only Sampled (without detail), TextDelta and Finished events.
        """
        engine = self.engine()
        if level != TraceLevel.OFF:
            yield self.tokenized(request)
        engine.scheduler.add(self.sequence_request(request, "single", level))
        while True:
            for output in engine.step():
                if output.error is not None:
                    raise output.error
                yield from output.events
                if output.done:
                    return

    def engine(self, config: SchedulerConfig = SchedulerConfig()) -> Engine:  # noqa: B008 (frozen)
        loaded = self.loaded
        return Engine(loaded.model, loaded.stop_ids, loaded.tokenizer.token_bytes, config)


def _fewest(enough: Callable[[int], bool], most: int) -> int:
    """The smallest n in 1..most for which `enough(n)` holds (or `most`), by bisection: the turns to drop from a
    conversation in a few renders, even for thousands of messages."""
    low, high = 1, most
    while low < high:
        middle = (low + high) // 2
        if enough(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _require_tokens(prompt: Prompt) -> None:
    """Nothing to run the model on (a raw empty prompt, and a model that puts no BOS first) is refused: run, it would
    never end."""
    if not prompt.ids:
        raise InvalidRequestError(
            "The prompt has no tokens: this model adds no beginning-of-text token, so an empty prompt gives it "
            "nothing to continue. Send at least one character.",
            "prompt",
        )
