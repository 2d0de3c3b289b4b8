"""An upstream's streamed chunks as the wire's trace events: what the API, the page and the usage row read of a local
model's turn, built from what the wire reveals.

Per choice, every token the upstream reports becomes a `Sampled` event (its text, log-probability and top
alternatives when the upstream sends log-probabilities; one per chunk otherwise), each chunk's text a `TextDelta`,
and the end a `Finished` event with the upstream's usage and the gateway's clocks. Tool calls the upstream streams as
`tool_calls` deltas are handed on as the `<tool_call>` text the API's tool-call reader takes apart, so an upstream's
calls reach the client in whichever API it asked. Token ids are -1 where the upstream names only the text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from webapp.worker import wire

Event = tuple[int, wire.TraceEvent]  # (choice index, event)
MAX_SERVER_TIMINGS = 16  # of an upstream's own `timings` numbers, how many `roundtrip_timings` carries on


@dataclass
class ChoiceState:
    tokens: int = 0  # tokens reported (log-probability entries, or chunks with text)
    text: list[str] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # seconds after the request went out
    finish_reason: str | None = None
    calls: dict[int, dict[str, str]] = field(default_factory=dict)  # tool call index -> {"name", "arguments"}


@dataclass
class ChunkReader:
    """Reads one upstream stream's chunks, in order; `sent` is when the request went out (perf_counter seconds)."""

    n: int
    sent: float
    seed: int = 0
    choices: dict[int, ChoiceState] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    server_timings: dict[str, float] | None = None  # the upstream's own account of its time, when it sends one
    ended: int = 0  # choices with their finish reason

    def read(self, chunk: dict[str, Any], t: float) -> list[Event]:
        """The events one chunk carries."""
        events: list[Event] = []
        self._chunk(chunk, t, events)
        return events

    def note(self, chunk: dict[str, Any], t: float) -> int:
        """What `read` keeps of one chunk (each choice's tokens, text and finish, the usage), without its events, for
        a stream relayed as it came (`UpstreamGeneration.relayed`): how many tokens it carried."""
        return self._chunk(chunk, t, None)

    @property
    def finished_all(self) -> bool:
        """Every choice has its finish reason."""
        return self.ended >= self.n

    @property
    def done(self) -> bool:
        """Every choice has its finish reason and the usage has come: nothing more is needed from the stream."""
        return self.finished_all and self.usage is not None

    def _chunk(self, chunk: dict[str, Any], t: float, events: list[Event] | None) -> int:
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            self.server_timings = server_timings(chunk["timings"])
        tokens = 0
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict):
                tokens += self._choice(choice, t, events)
        return tokens

    def _choice(self, choice: dict[str, Any], t: float, events: list[Event] | None) -> int:
        """One choice's part of a chunk: its state brought up to date and, when `events` is a list, its events added;
        the number of tokens it carried."""
        index = int(choice.get("index") or 0)
        state = self.choices.setdefault(index, ChoiceState())
        delta = choice.get("delta")
        text = (delta or {}).get("content") if isinstance(delta, dict) else choice.get("text")
        tokens = 0
        if events is not None and isinstance(delta, dict):
            self._calls(state, delta.get("tool_calls"))  # relayed, tool call deltas reach the client as they came
        if isinstance(text, str) and text:
            entries = _logprob_entries(choice)
            tokens = len(entries) or 1  # no log-probabilities: the chunk is one token as far as the wire shows
            first = state.tokens + 1  # steps count from 1, as the engine's do
            state.tokens += tokens
            state.token_times += [t - self.sent] * tokens
            state.text.append(text)
            if events is not None:
                events += self._text_events(index, entries or [{"token": text, "logprob": 0.0}], first, text, t)
        if choice.get("finish_reason") and state.finish_reason is None:
            state.finish_reason = str(choice["finish_reason"])
            self.ended += 1
            if state.calls and events is not None:
                events.append((index, _calls_text(state, t)))
        return tokens

    @staticmethod
    def _text_events(index: int, entries: list[dict[str, Any]], first: int, text: str, t: float) -> list[Event]:
        """A Sampled event per token, then the chunk's text."""
        sampled = [_sampled(entry, first + i, t) for i, entry in enumerate(entries)]
        last = sampled[-1]
        delta = wire.TextDelta(
            t=t, step=last.step, token_id=last.token_id, token=last.token, text=text, pending_bytes=[], held_text=""
        )
        return [*((index, s) for s in sampled), (index, delta)]

    @staticmethod
    def _calls(state: ChoiceState, deltas: Any) -> None:
        for delta in deltas or ():
            if not isinstance(delta, dict):
                continue
            call = state.calls.setdefault(int(delta.get("index") or 0), {"name": "", "arguments": ""})
            function = delta.get("function") or {}
            call["name"] += function.get("name") or ""
            call["arguments"] += function.get("arguments") or ""

    def finish(self, t: float) -> list[Event]:
        """Each choice's Finished event, once the stream has ended: the upstream's usage (split over choices by the
        tokens each reported, the rest to the first), the gateway's clocks."""
        usage = self.usage or {}
        counted = {i: c.tokens for i, c in self.choices.items()}
        total = usage.get("completion_tokens")
        if isinstance(total, int) and counted:
            counted[min(counted)] += total - sum(counted.values())
        prompt = usage["prompt_tokens"] if isinstance(usage.get("prompt_tokens"), int) else 0
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else 0
        return [
            (
                index,
                wire.Finished(
                    t=t,
                    finish_reason=_reason(state.finish_reason),
                    prompt_tokens=prompt,
                    completion_tokens=max(0, counted[index]),
                    seed=self.seed,
                    text="".join(state.text),
                    timings=_timings(state, t - self.sent),
                    cached_tokens=cached if isinstance(cached, int) else 0,
                ),
            )
            for index, state in sorted(self.choices.items())
        ]


def server_timings(reported: dict[str, Any]) -> dict[str, float]:
    """The numbers of an upstream's `timings` (llama-server's: `prompt_n`, `prompt_ms`, `predicted_ms`, ...), at most
    `MAX_SERVER_TIMINGS` of them with short names: what the server says its prefill and decoding took, beside the
    gateway's own clocks. They come from another server, so nothing else of them is passed on."""
    out: dict[str, float] = {}
    for name, value in reported.items():
        if len(out) == MAX_SERVER_TIMINGS:
            break
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if number and isinstance(name, str) and len(name) <= 40:
            out[name] = value
    return out


def _logprob_entries(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """A chunk's tokens with their log-probabilities, in Chat Completions' shape (`content`), whichever API sent
    them (legacy completions send parallel lists)."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return []
    if isinstance(logprobs.get("content"), list):
        return [e for e in logprobs["content"] if isinstance(e, dict)]
    tokens, values, tops = logprobs.get("tokens"), logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list):
        return []
    tops = tops if isinstance(tops, list) else [None] * len(tokens)
    return [
        {
            "token": token,
            "logprob": value,
            "top_logprobs": [{"token": k, "logprob": v} for k, v in (top or {}).items()],
        }
        for token, value, top in zip(tokens, values, tops, strict=False)
    ]


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else -1e9


def _sampled(entry: dict[str, Any], step: int, t: float) -> wire.Sampled:
    token = str(entry.get("token", ""))
    top = [
        wire.TopLogprob(
            id=int(alt.get("id", -1)),
            token=str(alt.get("token", "")),
            logprob=_number(alt.get("logprob")),
            bytes=list(alt.get("bytes") or token_bytes(str(alt.get("token", "")))),
        )
        for alt in entry.get("top_logprobs") or ()
        if isinstance(alt, dict)
    ]
    rank = next((i for i, alt in enumerate(top) if alt.token == token), 0)
    candidates = [
        wire.Candidate(
            token_id=alt.id,
            token=alt.token,
            raw_prob=math.exp(alt.logprob),
            adjusted_prob=math.exp(alt.logprob),
            removed_by=None,
            final_prob=math.exp(alt.logprob),
        )
        for alt in top
    ]
    detail = wire.SamplingDetail(candidates=candidates, draw=None, kept=len(top), eos_prob=0.0) if top else None
    return wire.Sampled(
        t=t,
        step=step,
        token_id=int(entry.get("id", -1)),
        token=token,
        bytes=list(entry.get("bytes") or token_bytes(token)),
        logprob=_number(entry.get("logprob", 0.0)),
        rank=rank,
        is_stop=False,
        duration=0.0,
        top_logprobs=top,
        detail=detail,
    )


def token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", "replace"))


def _calls_text(state: ChoiceState, t: float) -> wire.TextDelta:
    """The upstream's tool calls as the `<tool_call>` blocks the API's reader takes apart."""
    blocks = []
    for _, call in sorted(state.calls.items()):
        try:
            arguments: Any = json.loads(call["arguments"] or "{}")
        except ValueError:
            arguments = call["arguments"]
        blocks.append(f"<tool_call>\n{json.dumps({'name': call['name'], 'arguments': arguments})}\n</tool_call>")
    state.calls.clear()
    return wire.TextDelta(
        t=t, step=state.tokens, token_id=-1, token="", text="\n".join(blocks), pending_bytes=[], held_text=""
    )


def _reason(upstream: str | None) -> Literal["stop", "length"]:
    return "length" if upstream == "length" else "stop"


def _timings(state: ChoiceState, total: float) -> wire.Timings:
    """The upstream's clocks as the gateway saw them: time to the first token, the decode after it."""
    times = state.token_times
    ttft = times[0] if times else total
    decode = times[-1] - times[0] if len(times) > 1 else 0.0
    gaps = len(times) - 1
    return wire.Timings(
        tokenize=0.0,
        queue=0.0,
        prefill=ttft,
        prefill_saved=0.0,
        ttft=ttft,
        decode=decode,
        total=total,
        token_times=times,
        mean_itl=decode / gaps if gaps > 0 else None,
        decode_tokens_per_s=gaps / decode if decode > 0 else None,
    )
