"""What an API client would have received for a page turn: its events through the API's own chat chunker
(`webapp.api.responses.ChatChunks`), as the exact SSE bytes of `POST /v1/chat/completions` with `"stream": true` and
`"stream_options": {"include_usage": true}`. The page shows them beside its own WebSocket frames."""

from __future__ import annotations

from webapp.api.completions import Choice, sse
from webapp.api.responses import ChatChunks
from webapp.gateway.lifecycle import Turn
from webapp.worker import wire

# A long answer's stream is cut in the middle past this many characters (an SSE comment line says how many events
# were left out), so that one frame stays far below the socket's message limit.
MAX_CHARS = 160_000


class SseReplay:
    def __init__(self, turn: Turn) -> None:
        self.chunks = ChatChunks(turn, logprobs=False, include_usage=True)
        self.choice = Choice(0, want_logprobs=False)
        self.events: list[bytes] = []

    def feed(self, event: wire.TraceEvent) -> None:
        self.events += self.chunks.pieces(self.choice, self.choice.feed(event))

    def body(self) -> str:
        """The whole stream as text, ending in the usage chunk and `data: [DONE]`."""
        events = [e.decode() for e in [*self.events, *self.chunks.end(), sse("[DONE]")]]
        if sum(map(len, events)) <= MAX_CHARS:
            return "".join(events)
        head: list[str] = []
        tail: list[str] = []
        room = MAX_CHARS // 2
        for event in events:
            if len(event) > room:
                break
            head.append(event)
            room -= len(event)
        room = MAX_CHARS // 2
        for event in reversed(events[len(head) :]):
            if len(event) > room:
                break
            tail.insert(0, event)
            room -= len(event)
        left_out = len(events) - len(head) - len(tail)
        return "".join([*head, f": {left_out} events left out here, to keep this view small\n\n", *tail])
