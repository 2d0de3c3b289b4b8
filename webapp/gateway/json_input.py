"""Reading a client's JSON (an API body or a socket frame) without letting any input escape as a server error.

`json.loads` alone turns hostile input into exceptions that are not the client's fault-shaped
errors: deep nesting raises RecursionError, a 5,000-digit integer raises ValueError, `NaN` and
`Infinity` are accepted though JSON has neither, and `"\\ud800"` is a valid escape that yields a
lone surrogate, which no encoder downstream can write. Each becomes `BadJSON`, with a message for
people and, for a lone surrogate, the field it was found in.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Where a lone surrogate can come from: an escape of one (\ud800 to \udfff), or the text itself holding one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class BadJSON(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _no_constants(name: str) -> None:
    raise BadJSON(f"{name} is not valid JSON (JSON numbers are finite).")


def loads_object(text: str, what: str = "The request body") -> dict[str, Any]:
    """The text as a JSON object; BadJSON for anything else, naming what is wrong."""
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except BadJSON:
        raise
    except json.JSONDecodeError as exc:
        raise BadJSON(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}.") from None
    except RecursionError:
        raise BadJSON(f"{what} is nested too deeply to read.") from None
    except ValueError:  # an integer beyond Python's digit limit
        raise BadJSON(f"{what} holds a number with too many digits.") from None
    if not isinstance(value, dict):
        raise BadJSON(f"{what} must be a JSON object.")
    if not _SURROGATE_ESCAPE.search(text) and _encodable(text):
        return value  # no string in it can hold a lone surrogate: the walk below costs 50 us on a chat body
    where = lone_surrogate(value)
    if where is not None:
        raise BadJSON(
            f"'{where}' contains a lone UTF-16 surrogate (an escape such as \\ud800 without its pair), which is not "
            "text.",
            where,
        )
    return value


def lone_surrogate(value: Any) -> str | None:
    """The path ("messages[0].content") of the first string (or key) holding a lone surrogate, if any."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return path or "(body)"
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if not _encodable(key):
                    return path or "(body)"
                stack.append((f"{path}.{key}" if path else key, child))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
