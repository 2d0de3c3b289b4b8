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
MAX_SCHEMA_DEPTH = 32  # nested objects and arrays in one JSON schema (real ones rarely pass 10)
MAX_SCHEMA_BYTES = 64 * 1024  # one schema, as JSON


def check_schema(schema: dict[str, Any]) -> None:
    """ValueError (the client's mistake, named by the caller's field) for a JSON schema a grammar should not be built
    from: nested deeper than MAX_SCHEMA_DEPTH, larger than MAX_SCHEMA_BYTES, or with a `$ref` that leads back to
    itself (the grammar of a recursive schema has no bound: llguidance gives up mid-answer)."""
    depth = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:  # iteratively: a schema nested hundreds deep must not exhaust the interpreter's stack
        node, level = stack.pop()
        depth = max(depth, level)
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"the schema is nested more than {MAX_SCHEMA_DEPTH} levels deep")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    if len(json.dumps(schema, separators=(",", ":"))) > MAX_SCHEMA_BYTES:
        raise ValueError(f"the schema takes more than {MAX_SCHEMA_BYTES // 1024} KiB")
    cycle = _ref_cycle(schema)
    if cycle:
        raise ValueError(f"the schema refers to itself ({' -> '.join(cycle)}): recursive schemas cannot be enforced")


def _ref_cycle(schema: dict[str, Any]) -> list[str]:
    """A chain of local `$ref`s ("#", "#/$defs/x", "#/definitions/x") that comes back to where it started, or []."""

    def refs_in(node: Any) -> list[str]:
        found, stack = [], [node]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                if isinstance(item.get("$ref"), str):
                    found.append(item["$ref"])
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
        return found

    def target(ref: str) -> Any:
        node: Any = schema
        for part in ref.removeprefix("#").strip("/").split("/") if ref != "#" else []:
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
        return node

    def walk(ref: str, path: list[str]) -> list[str]:
        if ref in path:
            return [*path[path.index(ref) :], ref]
        node = target(ref) if ref.startswith("#") else None
        for inner in refs_in(node) if node is not None else []:
            if found := walk(inner, [*path, ref]):
                return found
        return []

    return next((cycle for ref in refs_in(schema) if (cycle := walk(ref, []))), [])


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
