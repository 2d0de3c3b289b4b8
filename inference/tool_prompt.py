"""How tools reach a model whose chat template does not mention them (SmolLM2's does not).

The model's own template decides when it can: a template that refers to `tools` is given the
tools and the messages' tool calls as they are. Otherwise the conversation is rewritten into the
three roles every template knows, in this documented format (the one Hermes- and Qwen-style
models are trained on, so a small model has seen it):

- the tools are listed in the system prompt (appended to the client's, or as a new one):
  "# Tools ... <tools>" one JSON function signature per line "</tools>" and how to call them;
- an assistant message's tool calls become its text: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- a `tool` message becomes a user message `<tool_response>\\n...\\n</tool_response>`.

The model answers a call in the same `<tool_call>` form, which the API turns back into
OpenAI's `tool_calls` (and, when the client forces a call, a grammar makes it exact).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"

SYSTEM_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML "
    "tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def template_takes_tools(source: str) -> bool:
    """Whether a chat template renders tools itself."""
    return "tools" in source


def system_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tool list as the system prompt states it."""
    return SYSTEM_TOOLS.format(
        tools="\n".join(json.dumps({"type": "function", "function": t}, ensure_ascii=False) for t in tools)
    )


def call_text(name: str, arguments: str) -> str:
    """One call as the model writes it; arguments that are JSON are written as an object, not a string."""
    try:
        args: Any = json.loads(arguments)
    except ValueError:
        args = arguments
    return CALL_OPEN + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + CALL_CLOSE


def plain_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, str]]:
    """The conversation in system/user/assistant messages with string contents (see the module's format)."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(call_text(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if tools:
        listing = system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{listing}"}
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out
