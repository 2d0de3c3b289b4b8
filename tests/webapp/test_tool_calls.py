"""The streaming tool-call reader: any split of the model's text gives the same content and calls."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from webapp.api.tool_calls import ToolCallParser

CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Paris", "units": {"t": "C"}, "note": "a } in \\" text"}}\n</tool_call>'
)


def run(text: str, cuts: list[int]) -> tuple[str, list[dict], ToolCallParser]:
    parser = ToolCallParser()
    content: list[str] = []
    deltas: list[dict] = []
    edges = [0, *sorted(cuts), len(text)]
    for a, b in itertools.pairwise(edges):
        piece, calls = parser.feed(text[a:b])
        content.append(piece)
        deltas += [d.as_delta() for d in calls]
    rest, cut = parser.finish()
    content.append(rest)
    deltas += [d.as_delta() for d in cut]
    return "".join(content), deltas, parser


@pytest.mark.parametrize("seed", range(40))
def test_it_reads_the_same_calls_whatever_the_chunking(seed: int) -> None:
    text = "Let me check. " + CALL + "\n" + CALL.replace("Paris", "Lyon")
    rng = random.Random(seed)
    content, deltas, parser = run(text, rng.sample(range(1, len(text)), rng.randint(0, 40)))
    assert content.strip() == "Let me check."
    assert [c.name for c in parser.calls] == ["get_weather", "get_weather"]
    assert json.loads(parser.calls[0].arguments)["note"] == 'a } in " text'
    assert json.loads(parser.calls[1].arguments)["city"] == "Lyon"
    first = [d for d in deltas if "id" in d]
    assert [d["index"] for d in first] == [0, 1] and all(d["type"] == "function" for d in first)
    for index in (0, 1):  # the fragments add up to the arguments
        assert (
            "".join(d["function"]["arguments"] for d in deltas if d["index"] == index) == parser.calls[index].arguments
        )


def test_it_takes_a_call_in_another_key_order_when_it_closes() -> None:
    content, deltas, parser = run('<tool_call>\n{"arguments": {"x": 1}, "name": "f"}\n</tool_call>', [5, 20])
    assert content == "" and parser.calls[0].name == "f" and json.loads(parser.calls[0].arguments) == {"x": 1}
    assert len(deltas) == 1 and deltas[0]["function"]["arguments"] == '{"x": 1}'


def test_text_that_only_looks_like_a_call_stays_content() -> None:
    content, deltas, parser = run("a <tool_ b <tool_call>not json</tool_call> c", [3, 9])
    assert content == "a <tool_ b <tool_call>not json</tool_call> c" and not parser.calls and not deltas


def test_plain_text_passes_through_untouched() -> None:
    content, deltas, _ = run("Hello <b>world</b>, 3 < 4", [1, 7, 8])
    assert content == "Hello <b>world</b>, 3 < 4" and deltas == []


def test_a_call_cut_after_its_name_is_still_a_call_with_what_it_has_of_its_arguments() -> None:
    content, deltas, parser = run('Sure.\n<tool_call>\n{"name": "get_weather", "argu', [9])
    assert content == "Sure." and [c.name for c in parser.calls] == ["get_weather"]
    assert parser.calls[0].arguments == "" and deltas[0]["function"]["name"] == "get_weather"
    _, _, parser = run('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', [20])
    assert parser.calls[0].arguments == '{"city": "Pa'
    content, _, parser = run('<tool_call>\n{"name": "get_wea', [5])
    assert content == '<tool_call>\n{"name": "get_wea' and not parser.calls  # not yet a call: the text it wrote


def test_whitespace_between_and_around_calls_is_not_content() -> None:
    two = CALL + "\n" + CALL.replace("Paris", "Lyon") + "\n"
    for cuts in ([], [len(CALL)], [len(CALL) + 1], [3, len(CALL) + 1, len(two) - 1]):
        content, _, parser = run(two, cuts)
        assert content == "" and len(parser.calls) == 2
    content, _, _ = run("Hello,\n\nworld \n", [6, 7])
    assert content == "Hello,\n\nworld \n"  # no calls: every character is content


def test_a_calls_fragments_in_one_piece_come_as_one_delta_after_its_opening() -> None:
    parser = ToolCallParser()
    _, deltas = parser.feed(CALL[:60])
    assert [(d.index, d.id is not None, d.arguments) for d in deltas] == [(0, True, ""), (0, False, CALL[49:60])]
    _, more = parser.feed(CALL[60:] + "\n" + CALL)
    assert [(d.index, d.id is not None) for d in more] == [(0, False), (1, True), (1, False)]
