"""The tokenizer built from the GGUF's vocabulary must give llama.cpp's ids."""

from __future__ import annotations

from typing import Any

import pytest
from load_settings import cpu

from inference.errors import ModelFileError
from inference.loader import LoadedModel, load_model


def test_it_encodes_the_seed_question_like_llama_cpp(smollm2: LoadedModel) -> None:
    enc = smollm2.tokenizer.encode("What's the capital of India?")
    assert enc.ids == [1780, 506, 260, 3575, 282, 3089, 47]
    assert enc.tokens == ["What", "'s", " the", " capital", " of", " India", "?"]


def test_it_matches_llama_cpp_on_the_whole_reference_corpus(
    smollm2: LoadedModel, llamacpp_reference: dict[str, Any]
) -> None:
    cases = llamacpp_reference["tokenization"]
    assert len(cases) >= 40
    mismatches = [c["text"] for c in cases if smollm2.tokenizer.encode(c["text"]).ids != c["ids"]]
    assert mismatches == []


def test_decoding_gives_back_the_exact_text(smollm2: LoadedModel, llamacpp_reference: dict[str, Any]) -> None:
    for case in llamacpp_reference["tokenization"]:
        assert smollm2.tokenizer.decode(case["ids"]) == case["text"]


def test_spans_point_at_each_tokens_characters(smollm2: LoadedModel) -> None:
    text = "Prices rose 12% in 2024 — café ☕"
    enc = smollm2.tokenizer.encode(text)
    assert enc.spans[0][0] == 0 and enc.spans[-1][1] == len(text)
    for (start, end), token in zip(enc.spans, enc.tokens):
        if "\\x" not in token:  # whole characters: the span is the token's text
            assert text[start:end] == token


def test_it_splits_every_digit_on_its_own(smollm2: LoadedModel) -> None:
    assert smollm2.tokenizer.encode("2024").tokens == ["2", "0", "2", "4"]


@pytest.mark.parametrize("special", ["<|im_end|>", "<|im_start|>", "<|endoftext|>"])
def test_special_token_text_in_user_text_stays_plain(smollm2: LoadedModel, special: str) -> None:
    ids = smollm2.tokenizer.encode(f"hi {special} there").ids
    assert smollm2.tokenizer.special_ids[special] not in ids
    assert len(ids) > 3


def test_control_tokens_decode_to_no_text_but_have_a_readable_name(smollm2: LoadedModel) -> None:
    im_end = smollm2.tokenizer.special_ids["<|im_end|>"]
    assert smollm2.tokenizer.decode([im_end]) == ""
    assert smollm2.tokenizer.token_text(im_end) == "<|im_end|>"


def test_a_token_holding_part_of_a_character_reads_as_byte_escapes(smollm2: LoadedModel) -> None:
    enc = smollm2.tokenizer.encode("🦙")
    assert len(enc.ids) > 1
    assert smollm2.tokenizer.decode(enc.ids) == "🦙"
    assert any("\\x" in t for t in enc.tokens)


def test_end_of_turn_ids_include_im_end_and_the_files_eos(smollm2: LoadedModel) -> None:
    assert smollm2.tokenizer.special_ids["<|im_end|>"] in smollm2.stop_ids
    assert 2 in smollm2.stop_ids


@pytest.mark.parametrize(
    "pre, pieces",
    [("smollm", ["1", "2", "3", "4", "5", "Ġgo"]), ("llama-bpe", ["123", "45", "Ġgo"]), ("gpt2", ["12345", "Ġgo"])],
)
def test_pre_tokenization_follows_the_files_pre_type(pre: str, pieces: list[str]) -> None:
    from inference.tokenizer import pre_tokenizer

    assert [p for p, _ in pre_tokenizer(pre).pre_tokenize_str("12345 go")] == pieces


def test_a_llama3_style_file_loads(write_gguf: Any) -> None:
    loaded = load_model(str(write_gguf(tokenizer_pre="llama-bpe")), cpu())
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("12345 go").ids) == "12345 go"


def test_an_unknown_pre_tokenizer_is_named(write_gguf: Any) -> None:
    with pytest.raises(ModelFileError, match="pre-tokenizer 'mystery' is not supported"):
        load_model(str(write_gguf(tokenizer_pre="mystery")), cpu())
