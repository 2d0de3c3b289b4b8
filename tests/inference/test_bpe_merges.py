"""Replaying the merge table step by step ends in exactly the tokens the tokenizer gives."""

from __future__ import annotations

from typing import Any

from inference.bpe_merges import merge_steps
from inference.loader import LoadedModel


def test_capital_is_built_from_its_bytes_by_the_tables_merges(smollm2: LoadedModel) -> None:
    [piece] = merge_steps(smollm2.tokenizer, " capital")
    assert piece.text == " capital" and piece.start == [" ", "c", "a", "p", "i", "t", "a", "l"]
    assert piece.ids == smollm2.tokenizer.encode(" capital").ids == [3575]
    ranks = [m.rank for m in piece.merges]
    assert ranks == sorted(ranks)  # better merges first, as BPE applies them
    assert piece.merges[-1].symbols == [" capital"]
    for before, after in zip([piece.start] + [m.symbols for m in piece.merges], [m.symbols for m in piece.merges]):
        assert "".join(before) == "".join(after) and len(after) < len(before)


def test_every_piece_of_the_reference_corpus_ends_in_the_tokenizers_ids(
    smollm2: LoadedModel, llamacpp_reference: dict[str, Any]
) -> None:
    for case in llamacpp_reference["tokenization"]:
        ids = [i for piece in merge_steps(smollm2.tokenizer, case["text"]) for i in piece.ids]
        assert ids == case["ids"], case["text"]
