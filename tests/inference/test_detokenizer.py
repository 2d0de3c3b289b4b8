"""Incremental detokenization: whole characters only, stop strings held back, no byte lost or doubled."""

from __future__ import annotations

import random

import pytest

from inference.detokenizer import IncrementalDetokenizer

# A byte-level vocabulary: token i is the single byte i, plus a few multi-byte tokens.
VOCAB: list[bytes] = [bytes([i]) for i in range(256)] + [b"Hello", b" world", b"\xe2\x82", b"\xac!", b"</s"]


def _ids(data: bytes) -> list[int]:
    return list(data)


def _run(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    deltas = [detok.push(i).text for i in ids]
    deltas.append(detok.flush().text)
    return deltas


def test_a_character_split_across_tokens_waits_for_its_last_byte() -> None:
    detok = IncrementalDetokenizer(VOCAB)
    first = detok.push(258)  # the first two bytes of the euro sign
    assert first.text == "" and first.pending_bytes == b"\xe2\x82"
    second = detok.push(259)
    assert second.text == "€!" and second.pending_bytes == b""


@pytest.mark.parametrize("seed", range(20))
def test_the_deltas_add_up_to_decoding_everything_at_once(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice(["a", " ", "é", "€", "🦙", "中文", "\n", "ß"]) for _ in range(40))
    data = text.encode()
    if seed % 2:  # also garbage: invalid and truncated sequences
        data = bytes(rng.randrange(256) for _ in range(60)) + data + b"\xf0\x9f"
    ids = _ids(data)
    assert "".join(_run(IncrementalDetokenizer(VOCAB), ids)) == data.decode("utf-8", errors="replace")


def test_text_that_might_start_a_stop_string_is_held_back() -> None:
    detok = IncrementalDetokenizer(VOCAB, stop=["STOP"])
    out = [detok.push(i) for i in _ids(b"go ST")]
    assert "".join(d.text for d in out) == "go "
    assert out[-1].held_text == "ST"
    release = detok.push(ord("x"))
    assert release.text == "STx" and release.held_text == ""


def test_a_stop_string_across_tokens_ends_the_text_before_it() -> None:
    detok = IncrementalDetokenizer(VOCAB, stop=["</s>"])
    deltas = [detok.push(i) for i in [256, 260, ord(">"), ord("z")]]
    assert "".join(d.text for d in deltas) == "Hello"
    assert deltas[2].stopped and detok.stopped
    assert deltas[3].text == ""


def test_the_earliest_of_several_stop_strings_wins() -> None:
    detok = IncrementalDetokenizer(VOCAB, stop=["world", " w"])
    text = "".join(detok.push(i).text for i in [256, 257])
    assert text == "Hello" and detok.matched == " w"  # the one that matched, for Anthropic's stop_sequence


def test_flush_releases_held_text_when_generation_ends() -> None:
    detok = IncrementalDetokenizer(VOCAB, stop=["STOP"])
    assert "".join(detok.push(i).text for i in _ids(b"abST")) == "ab"
    assert detok.flush().text == "ST"


def test_flush_turns_a_dangling_partial_character_into_a_replacement_mark() -> None:
    detok = IncrementalDetokenizer(VOCAB)
    assert detok.push(258).text == ""
    assert detok.flush().text == "\ufffd"
