"""The grammar's bounds (`webapp.api.structured`): what a schema leaves open is closed, what it says is kept."""

from __future__ import annotations

from typing import Any

import llguidance

from webapp.api import structured
from webapp.api.structured import MAX_ITEMS, MAX_PARALLEL_CALLS, MAX_STRING, Function, bounded, grammar


def test_open_strings_and_arrays_get_bounds_and_bounded_ones_keep_theirs() -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "colour": {"type": "string", "enum": ["red", "blue"]},
            "short": {"type": "string", "maxLength": 5},
            "tags": {"type": "array", "items": {"type": "string"}},
            "pair": {"type": "array", "maxItems": 2, "items": {"type": ["string", "null"]}},
        },
    }
    out = bounded(schema)["properties"]
    assert out["name"]["maxLength"] == MAX_STRING and "maxLength" not in out["code"] | out["colour"]
    assert out["short"]["maxLength"] == 5
    assert out["tags"]["maxItems"] == MAX_ITEMS and out["tags"]["items"]["maxLength"] == MAX_STRING
    assert out["pair"]["maxItems"] == 2 and out["pair"]["items"]["maxLength"] == MAX_STRING


def test_objects_that_list_properties_allow_only_those_unless_they_say_otherwise() -> None:
    nested: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}}}}
    out = bounded(nested)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    open_on_purpose = {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}}
    assert bounded(open_on_purpose)["additionalProperties"] == {"type": "integer"}
    in_defs = bounded(
        {"$defs": {"P": {"type": "object", "properties": {"x": {"type": "string"}}}}, "$ref": "#/$defs/P"}
    )
    assert in_defs["$defs"]["P"]["additionalProperties"] is False


def test_an_object_without_properties_is_any_object_within_bounds() -> None:
    out = bounded({"type": "object", "description": "anything"})
    assert out["description"] == "anything" and out["additionalProperties"] is False
    assert out["maxProperties"] == structured.MAX_MEMBERS and len(out["patternProperties"]) == 1


def test_a_forced_call_is_one_call_unless_parallel_calls_are_allowed() -> None:
    weather = [Function("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})]
    one, several = grammar(None, weather, True, False), grammar(None, weather, True, True)
    assert one is not None and several is not None
    assert "calls: call\n" in one
    assert f'calls: call ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' in several
    for lark in (one, several, grammar(structured.ANY_OBJECT, [], False, False)):
        assert lark is not None
        error, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(
            llguidance.LLMatcher.grammar_from_lark(lark)
        )
        assert not error and not warnings
