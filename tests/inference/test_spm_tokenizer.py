"""The SentencePiece-style tokenizer on a small vocabulary written here: llama.cpp's merging by score, user-defined
tokens cut out first, the space prefix, byte fallback and its incremental detokenization. (The real Gemma 3
vocabulary against llama.cpp's ids: `test_reference_gemma3.py`.)"""

from __future__ import annotations

import pytest

from inference.bpe_merges import merge_steps
from inference.detokenizer import IncrementalDetokenizer
from inference.errors import ModelFileError
from inference.gguf_file import TokenizerData
from inference.spm_tokenizer import SentencePieceTokenizer

CONTROL, NORMAL, USER, BYTE = 3, 1, 4, 6
PIECES = [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("\n\n", USER)]
PIECES += [(f"<0x{b:02X}>", BYTE) for b in range(256)]
# normal pieces, best score first: "▁t" + "he" would build "▁the" only through "▁t" and "he", both in the vocabulary
PIECES += [(p, NORMAL) for p in ("▁the", "he", "▁t", "▁", "t", "h", "e", "a", "▁a", "é")]


def tokenizer(add_space_prefix: bool = False) -> SentencePieceTokenizer:
    tokens = [p for p, _ in PIECES]
    scores = [0.0 if kind != NORMAL else -float(i) for i, (_, kind) in enumerate(PIECES)]
    data = TokenizerData("llama", "default", tokens, [k for _, k in PIECES], [], scores, add_space_prefix)
    return SentencePieceTokenizer(data)


def ids_of(t: SentencePieceTokenizer, *pieces: str) -> list[int]:
    return [t.piece_ids[p] for p in pieces]


def test_the_best_scored_merges_win_and_spaces_become_the_block() -> None:
    t = tokenizer()
    assert t.encode("the a").ids == ids_of(t, "t", "he", "▁a")  # no "▁" in front: the file says no space prefix
    assert t.encode(" the").ids == ids_of(t, "▁the")
    assert t.decode(t.encode(" the a").ids) == " the a"


def test_the_space_prefix_is_added_when_the_file_asks() -> None:
    t = tokenizer(add_space_prefix=True)
    enc = t.encode("the")
    assert enc.ids == ids_of(t, "▁the") and enc.spans == [(0, 3)]


def test_with_a_space_prefix_every_stretch_after_a_user_defined_token_gets_one_too() -> None:
    """As llama.cpp: a "▁" before the text and after each user-defined token (here "\n\n")."""
    t = tokenizer(add_space_prefix=True)
    assert t.encode("the\n\nthe").ids == ids_of(t, "▁the", "\n\n", "▁the")
    assert t.pre_tokenize("the\n\nthe") == ["▁the", "\n\n", "▁the"]


def test_user_defined_tokens_are_cut_out_first_and_control_tokens_never() -> None:
    t = tokenizer()
    ids = t.encode("the\n\n<eos>").ids
    assert ids[2] == t.piece_ids["\n\n"]
    assert t.piece_ids["<eos>"] not in ids  # typed as text, a control token's name stays characters


def test_characters_no_piece_covers_fall_back_to_their_bytes() -> None:
    t = tokenizer()
    ids = t.encode("a🦙").ids
    assert ids == [t.piece_ids["a"]] + [t.byte_ids[b] for b in "🦙".encode()]
    assert t.decode(ids) == "a🦙" and t.token_text(ids[1]) == "\\xf0"


def test_byte_fallback_pieces_detokenize_incrementally_without_broken_characters() -> None:
    t = tokenizer()
    detokenizer = IncrementalDetokenizer(t.token_bytes)
    shown = [detokenizer.push(i).text for i in t.encode("a🦙é").ids]
    assert shown == ["a", "", "", "", "🦙", "é"]


def test_the_tokenization_stage_gets_sentencepiece_merge_steps() -> None:
    t = tokenizer()
    (piece,) = merge_steps(t, " the")
    assert piece.text == "▁the" and piece.ids == ids_of(t, "▁the")
    # "he" scores above "▁t": merged first; a merge's rank is the merged piece's id
    assert [m.pair for m in piece.merges] == [("h", "e"), ("▁", "t"), ("▁t", "he")]
    assert [m.rank for m in piece.merges] == ids_of(t, "he", "▁t", "▁the")
    assert piece.merges[-1].symbols == ["▁the"]


def test_a_vocabulary_without_its_byte_tokens_is_a_clear_error() -> None:
    data = TokenizerData("llama", "default", ["<unk>", "a"], [CONTROL, NORMAL], [], [0.0, -1.0], False)
    with pytest.raises(ModelFileError, match="byte tokens"):
        SentencePieceTokenizer(data, "x.gguf")
