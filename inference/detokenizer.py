"""Incremental detokenization: bytes in, complete text out, stop strings held back.

A byte-level token can end in the middle of a UTF-8 character; its bytes wait until
the character is complete. Text that could be the start of a stop string is held back
until it is clearly not one. Every byte goes out exactly once: the concatenation of
all deltas equals decoding the whole sequence at once (up to a matched stop string).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Delta:
    """What one token did to the text: the new text, the bytes still waiting, the text held back."""

    text: str
    pending_bytes: bytes  # an incomplete UTF-8 character
    held_text: str  # could be the start of a stop string
    stopped: bool  # a stop string matched; `text` ends just before it


class IncrementalDetokenizer:
    def __init__(self, token_bytes: Sequence[bytes], stop: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(stop)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text (the earliest found)

    def push(self, token_id: int) -> Delta:
        """Add one token's bytes; return the text that is now safe to show."""
        if self.stopped:
            return Delta("", b"", "", True)
        return self._release(self._decoder.decode(self._token_bytes[token_id]), final=False)

    def flush(self) -> Delta:
        """End of generation: release held text and any dangling bytes (as U+FFFD)."""
        if self.stopped:
            return Delta("", b"", "", True)
        return self._release(self._decoder.decode(b"", final=True), final=True)

    def _release(self, new_text: str, final: bool) -> Delta:
        text = self._held + new_text
        pending = self._decoder.getstate()[0]
        hits = [(at, stop) for stop in self._stop if (at := text.find(stop)) != -1]
        if hits:
            at, self.matched = min(hits)
            self.stopped = True
            self._held = ""
            return Delta(text[:at], b"", "", True)
        keep = 0 if final else self._longest_stop_prefix_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return Delta(text[: len(text) - keep], pending, self._held, False)

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        """Length of the longest end of `text` that begins some stop string."""
        best = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if stop.startswith(text[-n:]):
                    best = n
                    break
        return best
