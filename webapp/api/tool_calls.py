"""Reading tool calls out of the model's text as it streams, and handing them on as OpenAI's `tool_calls` deltas.

The model writes a call as `<tool_call>\\n{"name": "...", "arguments": {...}}\\n</tool_call>` (see
`inference.tool_prompt`). Text outside calls is content. Inside a call, as soon as the name is
known a delta opens the call (index, id, type, name, empty arguments), and the arguments object
follows in fragments as the model writes it, the way OpenAI streams them. A call written in
another key order is handed on whole when it closes; one that is not valid JSON stays content.
Whitespace between, before and after calls (the newline that separates two calls) is not content:
it is held back until text follows, so the streamed content is exactly the whole answer's.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_NAME = r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"'
_HEAD = re.compile(_NAME + r'\s*,\s*"arguments"\s*:\s*(?=\{)')
_CUT_AFTER_NAME = re.compile(_NAME + r'(?:\s*,\s*"arguments"\s*:\s*(.*))?', re.DOTALL)


@dataclass
class CallDelta:
    """One `tool_calls` delta: the first of a call carries id and name; later ones carry argument text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def as_delta(self) -> dict[str, Any]:
        if self.id is not None:
            return {
                "index": self.index,
                "id": self.id,
                "type": "function",
                "function": {"name": self.name, "arguments": self.arguments},
            }
        return {"index": self.index, "function": {"arguments": self.arguments}}


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ToolCallParser:
    """Feed text pieces in order; each call returns (content text, call deltas) ready to send."""

    calls: list[ToolCall] = field(default_factory=list)
    _buffer: str = ""  # text not yet handed on
    _inside: bool = False
    _streaming: bool = False  # inside a call whose arguments are being streamed
    _depth: int = 0  # of the arguments object, while streaming it
    _in_string: bool = False
    _escaped: bool = False
    _args_done: bool = False
    _held: str = ""  # trailing whitespace of the content so far: released only if text follows
    _before: str = ""  # the whitespace held before `<tool_call>`: content again if no call follows

    def _release(self, text: str) -> str:
        """Content to send now: everything up to its last non-space character (the rest is held)."""
        text = self._held + text
        kept = text.rstrip()
        self._held = text[len(kept) :]
        return kept

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        self._buffer += text
        content: list[str] = []
        deltas: list[CallDelta] = []
        while True:
            if not self._inside:
                at = self._buffer.find(OPEN)
                if at < 0:
                    keep = _partial_suffix(self._buffer, OPEN)
                    content.append(self._release(self._buffer[: len(self._buffer) - keep]))
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    break
                content.append(self._release(self._buffer[:at]))
                self._buffer, self._before, self._held = self._buffer[at + len(OPEN) :], self._held, ""
                self._inside, self._streaming, self._args_done = True, False, False
                continue
            if not self._streaming:
                head = _HEAD.match(self._buffer)
                if head is not None:
                    call = ToolCall(_call_id(), json.loads(f'"{head.group(1)}"'))
                    self.calls.append(call)
                    deltas.append(CallDelta(len(self.calls) - 1, "", call.id, call.name))
                    self._buffer = self._buffer[head.end() :]
                    self._streaming, self._depth, self._in_string, self._escaped = True, 0, False, False
                    continue
                end = self._buffer.find(CLOSE)
                if end < 0:
                    break
                whole, self._buffer, self._inside = self._buffer[:end], self._buffer[end + len(CLOSE) :], False
                parsed = _parse_whole(whole)
                if parsed is None:
                    content.append(self._release(self._before + OPEN + whole + CLOSE))
                else:
                    self.calls.append(parsed)
                    deltas.append(CallDelta(len(self.calls) - 1, parsed.arguments, parsed.id, parsed.name))
                continue
            if not self._args_done:
                taken = self._scan_arguments()
                if taken:
                    self.calls[-1].arguments += taken
                    deltas.append(CallDelta(len(self.calls) - 1, taken))
                if not self._args_done:
                    break
            end = self._buffer.find(CLOSE)
            if end < 0:
                break
            self._buffer, self._inside, self._streaming = self._buffer[end + len(CLOSE) :], False, False
        return "".join(content), _merged(deltas)

    def finish(self) -> tuple[str, list[CallDelta]]:
        """The end of the text: whatever is held back that is not part of a call, as content. A call cut short (by
        max_tokens) after its name is still a call, with what it has of its arguments; one cut before its name was
        whole stays the text the model wrote."""
        rest, self._buffer = self._buffer, ""
        deltas: list[CallDelta] = []
        cut = _CUT_AFTER_NAME.match(rest) if self._inside and not self._streaming else None
        if cut is not None:
            self.calls.append(ToolCall(_call_id(), json.loads(f'"{cut.group(1)}"'), cut.group(2) or ""))
            call = self.calls[-1]
            deltas.append(CallDelta(len(self.calls) - 1, call.arguments, call.id, call.name))
            rest = ""
        elif self._inside and not self._streaming:
            rest = self._before + OPEN + rest
        elif self._inside:
            rest = ""
        text = self._release(rest)
        held, self._held = self._held, ""
        return (text if self.calls else text + held), deltas

    def _scan_arguments(self) -> str:
        """Take the arguments object's characters from the buffer, up to its closing brace."""
        for i, ch in enumerate(self._buffer):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    taken, self._buffer = self._buffer[: i + 1], self._buffer[i + 1 :]
                    self._args_done = True
                    return taken
        taken, self._buffer = self._buffer, ""
        return taken


def _merged(deltas: list[CallDelta]) -> list[CallDelta]:
    """A call's opening delta (id, name, no arguments, as OpenAI opens one), then its argument fragments of the
    piece joined into one delta."""
    out: list[CallDelta] = []
    for delta in deltas:
        if out and out[-1].index == delta.index and out[-1].id is None and delta.id is None:
            out[-1].arguments += delta.arguments
        elif delta.arguments or delta.id:
            out.append(delta)
    return out


def _partial_suffix(text: str, marker: str) -> int:
    """How many trailing characters of `text` could be the start of `marker` (held back until we know)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _parse_whole(text: str) -> ToolCall | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    return ToolCall(_call_id(), value["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def _call_id() -> str:
    return "call_" + secrets.token_hex(12)
