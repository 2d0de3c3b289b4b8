"""How byte-level BPE turns a piece of text into its tokens, step by step, from the tokenizer's own merge table.

The text is pre-tokenized as the tokenizer does (words with their leading space, digits, punctuation); each piece
starts as its bytes, and the merge with the best (lowest) rank among adjacent pairs is applied, everywhere it occurs,
until no pair of the piece is in the table. What is left are the tokens `BPETokenizer.encode` gives; the page's
tokenization stage shows the steps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from inference.spm_tokenizer import SentencePieceTokenizer
from inference.tokenizer import BPETokenizer, Tokenizer, unicode_to_byte


@dataclass(frozen=True)
class Merge:
    rank: int  # the merge's line in the table: lower merges first
    pair: tuple[str, str]  # the two symbols joined, readable (their bytes as text)
    symbols: list[str]  # the piece after this merge


@dataclass(frozen=True)
class PieceMerges:
    text: str  # the pre-tokenized piece
    start: list[str]  # its bytes, each a symbol
    merges: list[Merge]
    ids: list[int]  # the tokens it ends as


def _readable(symbol: str) -> str:
    to_byte = unicode_to_byte()
    return bytes(to_byte.get(ch, 0) for ch in symbol).decode("utf-8", errors="backslashreplace")


def _ranks(tokenizer: BPETokenizer) -> dict[tuple[str, str], int]:
    ranks: dict[tuple[str, str], int] | None = getattr(tokenizer, "_merge_ranks", None)
    if ranks is None:
        ranks = {}
        for rank, line in enumerate(tokenizer.merges):
            left, right = line.split(" ", 1)
            ranks.setdefault((left, right), rank)
        tokenizer._merge_ranks = ranks  # type: ignore[attr-defined]  # built once per tokenizer, on first use
    return ranks


def merge_piece(tokenizer: BPETokenizer, piece: str) -> PieceMerges:
    """The merges of one pre-tokenized piece (in the byte-level alphabet), in the order BPE applies them."""
    ranks = _ranks(tokenizer)
    symbols = list(piece)
    merges: list[Merge] = []
    while len(symbols) > 1:
        pairs = {(a, b) for a, b in itertools.pairwise(symbols) if (a, b) in ranks}
        if not pairs:
            break
        best = min(pairs, key=lambda pair: ranks[pair])
        merged: list[str] = []
        i = 0
        while i < len(symbols):
            if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                merged.append(symbols[i] + symbols[i + 1])
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
        merges.append(Merge(ranks[best], (_readable(best[0]), _readable(best[1])), [_readable(s) for s in symbols]))
    ids = [tokenizer.token_id(s) for s in symbols]
    return PieceMerges(_readable(piece), [_readable(ch) for ch in piece], merges, ids)


def merge_steps(tokenizer: Tokenizer, text: str) -> list[PieceMerges]:
    """Every pre-tokenized piece of `text` with its merges: byte-level BPE's by rank, or SentencePiece's by score
    (its pieces keep their "▁"; a merge's `rank` is then the merged piece's id, its vocabulary being ordered by
    score)."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        return [_sentencepiece_piece(tokenizer, piece) for piece in tokenizer.pre_tokenize(text)]
    assert isinstance(tokenizer, BPETokenizer)
    return [merge_piece(tokenizer, piece) for piece in tokenizer.pre_tokenize(text)]


def _sentencepiece_piece(tokenizer: SentencePieceTokenizer, piece: str) -> PieceMerges:
    if piece in tokenizer.user_defined:  # cut out whole, before any merging
        return PieceMerges(piece, [piece], [], [tokenizer.piece_ids[piece]])
    log, ids = tokenizer.merge_log(piece)
    return PieceMerges(piece, list(piece), [Merge(id_, (left, right), after) for left, right, id_, after in log], ids)
