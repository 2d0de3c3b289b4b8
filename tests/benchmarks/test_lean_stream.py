"""The benchmarks' lean HTTP reader: plain and chunked answers, split anywhere, and the ways an answer can fail."""

from __future__ import annotations

import pytest

from benchmarks.lean_stream import Answer, HTTPStatusError, IncompleteAnswer

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
EVENTS = [
    b'data: {"choices":[{"delta":{"content":"Hi"}}]}',
    b"",
    b'data: {"choices":[{"delta":{"content":" there"}}]}',
    b"",
    b"data: [DONE]",
    b"",
]


def chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def read(raw: bytes, step: int) -> tuple[list[bytes], Answer]:
    answer, lines = Answer(), []
    for i in range(0, len(raw), step):
        lines += answer.feed(raw[i : i + step])
    return lines + answer.close(), answer


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 10_000])
def test_it_reads_a_chunked_answer_however_the_bytes_arrive(step: int) -> None:
    body = b"\n".join(EVENTS)
    raw = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked([body[:10], body[10:55], body[55:]])
    lines, answer = read(raw, step)
    assert lines == EVENTS[:-1] and answer.done


@pytest.mark.parametrize("step", [1, 5, 10_000])
def test_it_reads_a_plain_answer_to_the_end(step: int) -> None:
    lines, _ = read(HEAD + b"\r\n" + b"\n".join(EVENTS[:-1]), step)
    assert lines == EVENTS[:-1]


def test_it_refuses_an_error_status() -> None:
    with pytest.raises(HTTPStatusError, match="HTTP 429"):
        Answer().feed(b"HTTP/1.1 429 Too Many Requests\r\n\r\n")


def test_a_chunked_answer_cut_short_is_an_error() -> None:
    answer = Answer()
    answer.feed(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"5\r\nhel")
    with pytest.raises(IncompleteAnswer):
        answer.close()
