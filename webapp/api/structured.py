"""The grammar a request's output must follow, as Lark text for the worker's llguidance matcher.

`response_format` json_object / json_schema makes the whole answer one JSON value; a forced tool
call (`tool_choice` "required" or a named function) makes it `<tool_call>` blocks whose JSON is
`{"name": ..., "arguments": <the function's parameters schema>}` (the format of
`inference.tool_prompt`); with tools on "auto" and a JSON response format, the answer is one or
the other. JSON is written compactly with ", " and ": " and no other whitespace, so a small model
cannot wander into blank lines. Built here as plain text: the web side needs no grammar library.

Answers that end. A small model can open a string or a list and never close it; the grammar bounds what a schema
leaves open, so the answer closes on its own well before a typical `max_tokens`:
- a string with no `maxLength`, `enum`, `const`, `pattern` or `format` holds at most MAX_STRING characters; an array
  with no `maxItems` at most MAX_ITEMS items;
- an object schema that lists `properties` allows only those keys, as OpenAI's strict mode does, unless it says
  otherwise with `additionalProperties` or `patternProperties` (strict or not: a non-strict schema differs only in
  that its optional properties may be left out);
- an object with no `properties` (json_object's answer, a tool without `parameters`) is any JSON object nested at
  most ANY_DEPTH deep, with at most MAX_MEMBERS keys of at most MAX_KEY characters each, its strings and arrays
  bounded as above;
- a forced call is one call, or with `parallel_tool_calls: true` at most MAX_PARALLEL_CALLS.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
MAX_STRING = 256  # characters in a JSON string the schema leaves unbounded
MAX_ITEMS = 32  # items in an array the schema leaves unbounded
MAX_KEY = 32  # characters in a key of an object with no listed properties
MAX_MEMBERS = 12  # keys in an object with no listed properties
ANY_DEPTH = 3  # nesting of objects and arrays inside an object with no listed properties
MAX_PARALLEL_CALLS = 4  # calls in one forced answer with parallel_tool_calls: true
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


def _any_value(depth: int) -> dict[str, Any]:
    """Any JSON value, its containers nested at most `depth` more levels."""
    scalars: list[dict[str, Any]] = [
        {"type": "string", "maxLength": MAX_STRING},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
    ]
    if depth == 0:
        return {"anyOf": scalars}
    return {
        "anyOf": [
            *scalars,
            {"type": "array", "items": _any_value(depth - 1), "maxItems": MAX_ITEMS},
            _any_object(depth),
        ]
    }


def _any_object(depth: int = ANY_DEPTH) -> dict[str, Any]:
    """Any JSON object, bounded: keys, members, strings, arrays and nesting (see the module's docstring)."""
    return {
        "type": "object",
        "patternProperties": {f"^.{{1,{MAX_KEY}}}$": _any_value(depth - 1)},
        "additionalProperties": False,
        "maxProperties": MAX_MEMBERS,
    }


_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "unevaluatedProperties")


def bounded(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with the bounds of the module's docstring added where it leaves strings, arrays or objects open."""
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: bounded(s) if isinstance(s, dict) else s for name, s in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [bounded(s) if isinstance(s, dict) else s for s in out[key]]
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = bounded(out[key])
    types = out.get("type")
    kinds = set(types) if isinstance(types, list) else {types}
    fixed = {"enum", "const"} & out.keys()
    if "string" in kinds and not fixed and not {"maxLength", "pattern", "format"} & out.keys():
        out["maxLength"] = MAX_STRING
    if "array" in kinds and not fixed and "maxItems" not in out:
        out["maxItems"] = MAX_ITEMS
    if ("object" in kinds or "properties" in out) and not {"additionalProperties", "patternProperties"} & out.keys():
        if "properties" in out:
            out["additionalProperties"] = False
        elif kinds == {"object"}:
            out |= _any_object()
    return out


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict[str, Any] | None  # JSON schema of the arguments; None: any object


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps(
        {**bounded(schema), "x-guidance": JSON_STYLE}, separators=(",", ":"), ensure_ascii=False
    )


def _relocated(node: Any, base: str) -> Any:
    """`node` with its local `$ref`s ("#", "#/...") rewritten to point under `base`, where it will now live."""
    if isinstance(node, list):
        return [_relocated(item, base) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _relocated(value, base) for key, value in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = base + ref[1:]
    return out


def _call_schema(functions: Sequence[Function]) -> dict[str, Any]:
    """The JSON of one call of any of `functions`. A function's parameters that use `$ref` (pydantic's `$defs`, as
    instructor sends them) move under the call schema's own `$defs`, their references rewritten to match: a `$ref`
    is resolved from the root of the schema it is in, which is now the call's."""
    defs: dict[str, Any] = {}
    calls = []
    for i, function in enumerate(functions):
        arguments = function.parameters or ANY_OBJECT
        if '"$ref"' in json.dumps(arguments):
            defs[f"f{i}"] = _relocated(arguments, f"#/$defs/f{i}")
            arguments = {"$ref": f"#/$defs/f{i}"}
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": function.name}, "arguments": arguments},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {**one, "$defs": defs} if defs else one


def _calls(functions: Sequence[Function], several: bool) -> list[str]:
    return [
        f'calls: call ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if several else "calls: call",
        'call: "<tool_call>\\n" call_json "\\n</tool_call>"',
        f"call_json: {_json(_call_schema(functions))}",
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
