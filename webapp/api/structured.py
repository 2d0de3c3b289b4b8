"""The grammar a request's output must follow, as Lark text for the worker's llguidance matcher.

`response_format` json_object / json_schema makes the whole answer one JSON value; a forced tool
call (`tool_choice` "required" or a named function) makes it `<tool_call>` blocks whose JSON is
`{"name": ..., "arguments": <the function's parameters schema>}` (the format of
`inference.tool_prompt`); with tools on "auto" and a JSON response format, the answer is one or
the other. JSON is written compactly with ", " and ": " and no other whitespace, so a small model
cannot wander into blank lines. Built here as plain text: the web side needs no grammar library.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict[str, Any] | None  # JSON schema of the arguments; None: any object


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": JSON_STYLE}, separators=(",", ":"), ensure_ascii=False)


def _call_schema(function: Function) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": function.name}, "arguments": function.parameters or ANY_OBJECT},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _calls(functions: Sequence[Function], several: bool) -> list[str]:
    schemas = [_call_schema(f) for f in functions]
    one = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return [
        'calls: call ("\\n" call)*' if several else "calls: call",
        'call: "<tool_call>\\n" call_json "\\n</tool_call>"',
        f"call_json: {_json(one)}",
    ]


def grammar(
    answer_schema: dict[str, Any] | None, functions: Sequence[Function], forced: bool, several: bool
) -> str | None:
    """Lark text for the output, or None when it is free text.

    `answer_schema`: the JSON the answer must be (ANY_OBJECT for json_object), None for text;
    `functions`: the tools the model may call; `forced`: it must call one of them (after
    narrowing to the named one); `several`: more than one call is allowed."""
    if forced and functions:
        return "\n".join(["start: calls", *_calls(functions, several)])
    if answer_schema is None:
        return None
    if functions:
        return "\n".join(["start: calls | answer", *_calls(functions, several), f"answer: {_json(answer_schema)}"])
    return f"start: answer\nanswer: {_json(answer_schema)}"
