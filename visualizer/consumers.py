"""WebSocket consumers: they only receive, call and forward.

`PipelineConsumer` (ws/pipeline/) runs one chat turn at a time for the page and forwards
its frames (see `visualizer.runs`); `WatchConsumer` (ws/watch/) lets staff watch API
requests from other clients go through the pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
from channels.generic.websocket import AsyncWebsocketConsumer

from visualizer.pacing import PACE_S, paced
from visualizer.questions import compare, inspect, merges, prompt_attention, resample
from visualizer.runs import Run, Visitor, error_frame
from visualizer.watch import WATCH_GROUP, watcher_joined, watcher_left
from webapp.gateway.client_ip import client_ip
from webapp.gateway.errors import bad_request
from webapp.gateway.json_input import BadJSON, loads_object

MAX_FRAME_BYTES = 64 * 1024  # larger frames get an error frame; past 1 MiB the socket closes with 1009 and a reason
QUESTIONS = {
    "inspect": inspect,
    "resample": resample,
    "prompt_attention": prompt_attention,
    "merges": merges,
    "compare": compare,
}
MAX_BATCH_BYTES = 256 * 1024  # frames sent together stay well under the server's 1 MiB message limit
_json = msgspec.json.Encoder()


class FrameConsumer(AsyncWebsocketConsumer):
    """JSON frames in and out; anything malformed gets an error frame, never a crash."""

    async def send_frame(self, frame: dict[str, Any]) -> None:
        """A frame as compact JSON; wire objects inside it (trace events, layer detail) are encoded as they are."""
        await self.send(text_data=_json.encode(frame).decode())

    async def send_frames(self, frames: list[dict[str, Any]]) -> None:
        """Frames in as few messages as fit: JSON arrays of at most `MAX_BATCH_BYTES` (a frame alone goes as itself).
        The server refuses a message past 1 MiB, and a paced second of `full` detail is several."""
        chunk: list[bytes] = []
        size = 0
        for frame in frames:
            encoded = _json.encode(frame)
            if chunk and size + len(encoded) > MAX_BATCH_BYTES:
                await self._send_encoded(chunk)
                chunk, size = [], 0
            chunk.append(encoded)
            size += len(encoded) + 1
        if chunk:
            await self._send_encoded(chunk)

    async def _send_encoded(self, chunk: list[bytes]) -> None:
        text = chunk[0] if len(chunk) == 1 else b"[" + b",".join(chunk) + b"]"
        await self.send(text_data=text.decode())

    async def error(self, message: str, code: str = "bad_message") -> None:
        await self.send_frame(error_frame(bad_request(message, code=code)))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None:
            await self.error("Frames must be JSON text, not binary.")
            return
        if len(text_data.encode()) > MAX_FRAME_BYTES:
            await self.error(f"Frame too large: at most {MAX_FRAME_BYTES} bytes.", "frame_too_large")
            return
        try:
            frame = loads_object(text_data, "The frame")
        except BadJSON as exc:
            await self.error(exc.message)
            return
        if not isinstance(frame.get("type"), str):
            await self.error("Frame must be a JSON object with a 'type'.")
            return
        await self.receive_frame(frame)

    async def receive_frame(self, frame: dict[str, Any]) -> None:
        """Subclasses handle their frame types; this answers the rest."""
        await self.error(f"Unknown frame type {frame['type']!r}.", "unknown_type")


class PipelineConsumer(FrameConsumer):
    run: Run | None = None
    task: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        await self.accept()
        await self.send_frame({"type": "hello"})

    async def disconnect(self, code: int) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def receive_frame(self, frame: dict[str, Any]) -> None:
        """Every frame gets an answer: its own frames, an error frame, or a pong."""
        kind = frame["type"]
        if kind == "chat":
            await self._chat(frame)
        elif kind in ("next", "cancel"):
            await self._control(kind)
        elif kind in QUESTIONS:
            await self.send_frame(await QUESTIONS[kind](self._visitor(), frame))
        elif kind == "ping":
            await self.send_frame({"type": "pong"})
        else:
            await self.error(
                f"Unknown frame type {kind!r}; expected chat, next, cancel, {', '.join(QUESTIONS)} or ping.",
                "unknown_type",
            )

    async def _chat(self, frame: dict[str, Any]) -> None:
        if self._running():
            await self.error("A turn is already running on this connection; wait for it or cancel it.", "busy")
            return
        self.run = Run(self._visitor(), frame)
        self.task = asyncio.create_task(self._forward(self.run))

    async def _control(self, kind: str) -> None:
        """Step mode's "next" (answered by the next token's frames) or "cancel" (by the turn's usage and done)."""
        if self.run is None or not self._running():
            await self.error(f"No turn is running on this connection: nothing to {kind}.", "no_turn")
        elif kind == "next":
            await self.run.next_token()
        else:
            await self.run.cancel()

    def _running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def _forward(self, run: Run) -> None:
        """The run's frames, paced (see `visualizer.pacing`): several in a message when they are ready together. A turn
        in step mode is not paced: its engine waits for the page's "next" after every token, so holding the token back
        would only hold the engine."""
        pace = 0.0 if run.payload.get("step") else PACE_S
        async with contextlib.aclosing(paced(run.frames(), pace)) as batches:
            async for batch in batches:
                await self.send_frames(batch)

    def _visitor(self) -> Visitor:
        user = self.scope.get("user")
        session = self.scope.get("session")
        client = self.scope.get("client") or ["", 0]
        headers = dict(self.scope.get("headers") or [])
        address = client_ip(client[0] or None, headers.get(b"x-forwarded-for", b"").decode("latin-1") or None)
        session_key = getattr(session, "session_key", None) or f"ip:{address}"
        user_id = user.pk if user is not None and user.is_authenticated else None
        return Visitor(user_id, session_key, address)


class WatchConsumer(FrameConsumer):
    """Staff only: frames of every API request, as they happen."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_staff:
            await self.close(code=4403)
            return
        await self.channel_layer.group_add(WATCH_GROUP, self.channel_name)
        await watcher_joined()
        await self.accept()
        await self.send_frame({"type": "hello", "watching": True})

    async def disconnect(self, code: int) -> None:
        user = self.scope.get("user")
        if user is not None and user.is_staff:
            await self.channel_layer.group_discard(WATCH_GROUP, self.channel_name)
            await watcher_left()

    async def receive_frame(self, frame: dict[str, Any]) -> None:
        if frame["type"] == "ping":
            await self.send_frame({"type": "pong"})
        else:
            await self.error("The watch socket only listens.", "read_only")

    async def watch_frame(self, message: dict[str, Any]) -> None:
        await self.send_frame(message["frame"])
