"""The function the API tests offer the model, once, shaped by each API's test as that API takes a tool: chat
completions `{"type": "function", "function": ...}`, Responses `{"type": "function", **...}`, Anthropic's
`input_schema`."""

from __future__ import annotations

from typing import Any

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
GET_WEATHER: dict[str, Any] = {"name": "get_weather", "description": "The weather in a city", "parameters": CITY}
