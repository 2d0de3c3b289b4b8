"""SentencePiece-style tokenization from a GGUF vocabulary with scores (`tokenizer.ggml.model = llama`: Gemma, Llama 2).

It follows llama.cpp's `llm_tokenizer_spm` so that ids match llama.cpp's:

1. user-defined tokens (type 4: Gemma's runs of newlines and tabs, `[multimodal]`) are cut out of the text first,
   longest first, as llama.cpp does even for plain text; control tokens are never recognised in text;
2. each remaining stretch becomes "▁"-for-space text (with a "▁" in front when the file asks, `add_space_prefix`)
   split into characters;
3. adjacent symbols are merged, best first, whenever their concatenation is in the vocabulary: the merged piece with
   the highest score wins, ties to the leftmost, until no pair merges;
4. each final symbol is its vocabulary id (a merge only ever builds a piece of the vocabulary); a character no piece
   covers falls back to its UTF-8 bytes, one `<0xXX>` token each (byte fallback).
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass

from tokenizers import Tokenizer as Tokenizer_

from inference.errors import ModelFileError
from inference.gguf_file import TokenizerData
from inference.tokenizer import CONTROL_TOKEN_TYPE, Encoding, Tokenizer

USER_DEFINED_TOKEN_TYPE = 4  # llama.cpp's LLAMA_TOKEN_TYPE_USER_DEFINED
BYTE_TOKEN_TYPE = 6  # LLAMA_TOKEN_TYPE_BYTE: "<0xAB>"
SPACE = "\u2581"  # "▁", SentencePiece's space
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass
class _Symbol:
    start: int  # characters of the escaped text
    end: int
    prev: int
    next: int


class SentencePieceTokenizer(Tokenizer):
    kind = "SentencePiece"

    def __init__(self, data: TokenizerData, path: str = "<gguf>") -> None:
        if len(data.scores) != len(data.tokens):
            raise ModelFileError(path, "tokenizer.ggml.scores and tokenizer.ggml.tokens differ in length")
        self.pieces = data.tokens
        self.scores = data.scores
        self.add_space_prefix = data.add_space_prefix
        self.piece_ids = {
            piece: i for i, piece in enumerate(data.tokens)
        }  # a repeated piece: its last id, as llama.cpp
        types = data.token_types
        self.special_ids = {t: i for i, (t, kind) in enumerate(zip(data.tokens, types)) if kind == CONTROL_TOKEN_TYPE}
        self.control_ids = frozenset(self.special_ids.values())
        self.byte_ids: dict[int, int] = {}
        self.token_bytes = []
        for i, (piece, kind) in enumerate(zip(data.tokens, types)):
            byte = _BYTE_PIECE.fullmatch(piece) if kind == BYTE_TOKEN_TYPE else None
            if byte:
                self.byte_ids[int(byte.group(1), 16)] = i
                self.token_bytes.append(bytes([int(byte.group(1), 16)]))
            elif i in self.control_ids:
                self.token_bytes.append(b"")
            else:
                self.token_bytes.append(piece.replace(SPACE, " ").encode())
        if len(self.byte_ids) < 256:
            raise ModelFileError(path, f"the vocabulary has {len(self.byte_ids)} of the 256 byte tokens <0x00>..<0xFF>")
        # longest first, as llama.cpp cuts them out
        self.user_defined = sorted(
            (t for t, kind in zip(data.tokens, types) if kind == USER_DEFINED_TOKEN_TYPE), key=len, reverse=True
        )

    def hugging_face(self) -> Tokenizer_:
        raise ValueError("only byte-level BPE vocabularies can be exported as a Hugging Face tokenizer so far")

    def pre_tokenize(self, text: str) -> list[str]:
        """The stretches merging works on: user-defined tokens on their own, the rest with "▁" for spaces."""
        return [piece for _, _, _, piece, _ in self._stretches(text)]

    def _stretches(self, text: str) -> list[tuple[int, int, bool, str, int]]:
        """(start, end, is a user-defined token, the stretch as merging reads it, how many characters were put in
        front of it): with `add_space_prefix`, a "▁" goes before the text's start and after each user-defined token,
        as llama.cpp prefixes every stretch that follows a special one."""
        out = []
        after_special = True
        for start, end, user_defined in self._fragments(text):
            if user_defined:
                out.append((start, end, True, text[start:end], 0))
            else:
                prefix = SPACE if self.add_space_prefix and after_special else ""
                out.append((start, end, False, prefix + text[start:end].replace(" ", SPACE), len(prefix)))
            after_special = user_defined
        return out

    def _fragments(self, text: str) -> list[tuple[int, int, bool]]:
        """(start, end, is a user-defined token) stretches of `text`, in order."""
        fragments = [(0, len(text), False)]
        for token in self.user_defined:
            if token not in text:
                continue
            cut: list[tuple[int, int, bool]] = []
            for start, end, special in fragments:
                if special:
                    cut.append((start, end, special))
                    continue
                at = start
                while (found := text.find(token, at, end)) >= 0:
                    if found > at:
                        cut.append((at, found, False))
                    cut.append((found, found + len(token), True))
                    at = found + len(token)
                if at < end:
                    cut.append((at, end, False))
            fragments = cut
        return fragments

    def encode(self, text: str) -> Encoding:
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        for start, end, user_defined, piece, prefix in self._stretches(text):
            if user_defined:
                ids.append(self.piece_ids[piece])
                spans.append((start, end))
                continue
            for token, (a, b) in self._merge(piece):
                ids.append(token)  # spans back in the caller's text: the space prefix is no character of it
                spans.append((start + max(0, a - prefix), start + max(0, b - prefix)))
        return Encoding(ids=ids, tokens=[self.token_text(i) for i in ids], spans=spans)

    def merge_log(self, text: str) -> tuple[list[tuple[str, str, int, list[str]]], list[int]]:
        """How one stretch (escaped, as `pre_tokenize` gives it) becomes its tokens: each merge as (left, right, the
        merged piece's id, the symbols after it), and the ids at the end."""
        log: list[tuple[str, str, int, list[str]]] = []
        ids = [token for token, _ in self._merge(text, log)]
        return log, ids

    def _merge(
        self, text: str, log: list[tuple[str, str, int, list[str]]] | None = None
    ) -> list[tuple[int, tuple[int, int]]]:
        """llama.cpp's bigram merging over the characters of `text` (already escaped): (id, character span) each;
        `log`, when given, receives every merge (`merge_log`)."""
        symbols = [_Symbol(i, i + 1, i - 1, i + 1 if i + 1 < len(text) else -1) for i in range(len(text))]
        queue: list[tuple[float, int, int, int]] = []  # (-score, left, right, size): best score, then leftmost

        def add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            a, b = symbols[left], symbols[right]
            token = self.piece_ids.get(text[a.start : b.end])
            if token is None:
                return
            heapq.heappush(queue, (-self.scores[token], left, right, b.end - a.start))

        for i in range(1, len(symbols)):
            add(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            a, b = symbols[left], symbols[right]
            if a.end == a.start or b.end == b.start or b.end - a.start != size:
                continue  # outdated: one side has merged since
            pair = (text[a.start : a.end], text[b.start : b.end])
            a.end, b.end = b.end, b.start
            a.next = b.next
            if b.next >= 0:
                symbols[b.next].prev = left
            if log is not None:
                log.append((*pair, self.piece_ids[text[a.start : a.end]], _texts(text, symbols)))
            add(a.prev, left)
            add(left, a.next)
        out: list[tuple[int, tuple[int, int]]] = []
        i = 0 if symbols else -1
        while i >= 0:
            span = (symbols[i].start, symbols[i].end)
            token = self.piece_ids.get(text[span[0] : span[1]])
            if token is not None:
                out.append((token, span))
            else:  # byte fallback: no piece covers this character
                out.extend((self.byte_ids[b], span) for b in text[span[0] : span[1]].encode())
            i = symbols[i].next
        return out


def _texts(text: str, symbols: list[_Symbol]) -> list[str]:
    """The symbols still standing, in order."""
    out, i = [], 0 if symbols else -1
    while i >= 0:
        out.append(text[symbols[i].start : symbols[i].end])
        i = symbols[i].next
    return out
