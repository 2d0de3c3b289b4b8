"""The GGUF file's own chat template, rendered in a Jinja sandbox and tokenized as segments.

The prompt is reported as segments (system prompt, earlier turns, the new message,
template markup) so the context window can be drawn. Special tokens are recognised
only in the template's own markup, never inside message content: each content is
wrapped in unguessable sentinels while rendering, and the sentinel ranges are
tokenized as plain text.
"""

from __future__ import annotations

import bisect
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NotRequired, TypedDict

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inference.errors import InvalidRequestError, ModelFileError
from inference.tokenizer import Tokenizer
from inference.tool_prompt import plain_messages, template_takes_tools

ROLES = ("system", "user", "assistant")
SegmentKind = Literal["system", "history", "message", "markup"]

# Used when a file carries no template: ChatML, which SmolLM2 and many others use.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma's turns, for Gemma files without a template (llama.cpp's `gemma` template does the same): the assistant is
# "model", a system message opens the first user turn.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% set first = '' %}{% set start = 0 %}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set first = messages[0]['content'] + '\n\n' %}{% set start = 1 %}{% endif %}"
    "{% for message in messages[start:] %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}"
    "{{ (first if loop.first else '') + message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
FAMILY_TEMPLATES = {"gemma3": GEMMA_TEMPLATE}  # by architecture, for files without a template; else ChatML


class Message(TypedDict):
    role: str
    content: str
    tool_calls: NotRequired[
        list[dict[str, Any]]
    ]  # an assistant's calls: [{"id", "type", "function": {"name", "arguments"}}]
    tool_call_id: NotRequired[str]  # a tool message: the call it answers
    name: NotRequired[str]


@dataclass(frozen=True)
class Segment:
    """A run of prompt tokens with one meaning; `message_index` is None for template markup."""

    kind: SegmentKind
    role: str | None
    message_index: int | None
    token_start: int
    token_end: int
    char_start: int
    char_end: int


@dataclass(frozen=True)
class Prompt:
    """The rendered prompt: its text, its tokens (with spans into `text`) and its segments."""

    text: str
    ids: list[int]
    tokens: list[str]
    spans: list[tuple[int, int]]
    segments: list[Segment]


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    """Renders messages with the file's `tokenizer.chat_template` and tokenizes the result."""

    def __init__(
        self,
        source: str,
        tokenizer: Tokenizer,
        bos_token: str = "",
        eos_token: str = "",
        path: str = "",
        add_bos: bool = False,
    ) -> None:
        """`add_bos`: a raw prompt (`plain`) starts with the BOS token, as the file's `tokenizer.ggml.add_bos_token`
        asks (Gemma's does, SmolLM2's does not); a template writes its own."""
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ModelFileError(path, f"tokenizer.chat_template does not compile ({exc})") from exc
        self.source = source
        self._tokenizer = tokenizer
        self._bos = bos_token
        self._eos = eos_token
        self._raw_prefix = bos_token if add_bos else ""
        specials = sorted(tokenizer.special_ids, key=len, reverse=True)
        self._special_re = re.compile("|".join(re.escape(s) for s in specials)) if specials else None

    def render(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        continue_final: bool = False,
    ) -> Prompt:
        """Render and tokenize; raises InvalidRequestError for messages the template cannot take.

        Tools (function definitions) and tool messages go to a template that renders tools; for any
        other template they are rewritten first (see `inference.tool_prompt`). `continue_final`: the last
        message is an unfinished assistant answer; the prompt ends inside it, so generation goes on from its text."""
        if continue_final and (not messages or messages[-1]["role"] != "assistant"):
            raise InvalidRequestError(
                "To continue the final message, the last message must be the assistant's.", "messages"
            )
        add_generation_prompt = add_generation_prompt and not continue_final
        native = template_takes_tools(self.source)
        if not native and (tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)):
            messages = plain_messages(messages, tools)  # type: ignore[assignment]
        _validate(messages, ROLES + ("tool",) if native else ROLES)
        nonce = secrets.token_hex(8)
        opens = [f"\ue000{nonce}:{i}\ue001" for i in range(len(messages))]
        close = f"\ue002{nonce}\ue003"
        wrapped = [{**m, "content": opens[i] + m["content"] + close} for i, m in enumerate(messages)]
        extra = {"tools": [{"type": "function", "function": t} for t in tools]} if native and tools else {}
        try:
            raw = self._template.render(
                messages=wrapped,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
                **extra,
            )
        except TemplateError as exc:
            raise InvalidRequestError(f"The model's chat template rejected these messages: {exc}", "messages") from exc
        text, contents = _strip_sentinels(raw, opens, close)
        if continue_final:  # cut what the template adds after the final message (its end-of-turn marker)
            final = contents.get(len(messages) - 1)
            if final is None:
                raise InvalidRequestError(
                    "The model's chat template does not show the final message, so it cannot be continued.", "messages"
                )
            text = text[: final[1]]
        default = self._default_system(messages, text, add_generation_prompt, extra)
        return self._tokenize(text, contents, messages, default)

    def _default_system(
        self, messages: Sequence[Message], text: str, add_generation_prompt: bool, extra: dict[str, Any]
    ) -> tuple[int, int] | None:
        """Where in `text` the template put a system prompt of its own, when the messages have none: found by
        rendering the messages bare, and again after a system message of ours, and taking what differs. Its tokens are
        a system prompt, not markup."""
        if any(m["role"] == "system" for m in messages):
            return None
        probe = f"\ue000{secrets.token_hex(8)}\ue001"
        try:
            bare = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **extra)
            given = self._template.render(
                messages=[{"role": "system", "content": probe}, *messages],
                add_generation_prompt=add_generation_prompt,
                **extra,
            )
        except TemplateError:
            return None
        if probe not in given:
            return None
        prefix, suffix = given.split(probe, 1)
        end = len(bare) - len(suffix)
        if end <= len(prefix) or not (bare.startswith(prefix) and bare.endswith(suffix)):
            return None
        default = bare[len(prefix) : end]
        return (len(prefix), end) if text[len(prefix) : end] == default else None

    def plain(self, text: str) -> Prompt:
        """Text as it is, without the template (legacy completions, a base model's completion): one segment after the
        BOS token where the file asks for one; control-token text stays text."""
        start = len(self._raw_prefix)
        return self._tokenize(
            self._raw_prefix + text, {0: (start, start + len(text))}, [{"role": "user", "content": text}]
        )

    def _tokenize(
        self,
        text: str,
        contents: dict[int, tuple[int, int]],
        messages: Sequence[Message],
        default_system: tuple[int, int] | None = None,
    ) -> Prompt:
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        for start, end, is_special in self._pieces(text, sorted(contents.values())):
            if is_special:
                ids.append(self._tokenizer.special_ids[text[start:end]])
                spans.append((start, end))
                continue
            enc = self._tokenizer.encode(text[start:end])
            ids.extend(enc.ids)
            spans.extend((start + a, start + b) for a, b in enc.spans)
        tokens = [self._tokenizer.token_text(i) for i in ids]
        segments = _segments(spans, contents, messages, default_system)
        return Prompt(text=text, ids=ids, tokens=tokens, spans=spans, segments=segments)

    def _pieces(self, text: str, protected: list[tuple[int, int]]) -> list[tuple[int, int, bool]]:
        """Split `text` into plain runs and special tokens; a special inside a message content does not count."""
        pieces: list[tuple[int, int, bool]] = []
        cursor = 0
        inside = _RangeLookup(protected)
        if self._special_re is not None:
            for match in self._special_re.finditer(text):
                if inside.find(match.start()) is not None:
                    continue
                if match.start() > cursor:
                    pieces.append((cursor, match.start(), False))
                pieces.append((match.start(), match.end(), True))
                cursor = match.end()
        if cursor < len(text):
            pieces.append((cursor, len(text), False))
        return pieces


def _validate(messages: Sequence[Message], roles: tuple[str, ...]) -> None:
    if not messages:
        raise InvalidRequestError("messages must contain at least one message", "messages")
    for i, m in enumerate(messages):
        if m.get("role") not in roles:
            raise InvalidRequestError(
                f"messages[{i}].role must be one of {', '.join(roles)}, got {m.get('role')!r}", f"messages[{i}].role"
            )
        if not isinstance(m.get("content"), str):
            raise InvalidRequestError(f"messages[{i}].content must be a string", f"messages[{i}].content")


class _RangeLookup:
    """Which of several disjoint [start, end) ranges holds a position, by binary search: rendering stays linear in
    the number of messages (a request of thousands of messages once took the engine tens of seconds)."""

    def __init__(self, ranges: Sequence[tuple[int, int]], labels: Sequence[int] | None = None) -> None:
        order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
        self._starts = [ranges[i][0] for i in order]
        self._ends = [ranges[i][1] for i in order]
        self._labels = [labels[i] if labels is not None else i for i in order]

    def find(self, position: int) -> int | None:
        i = bisect.bisect_right(self._starts, position) - 1
        return self._labels[i] if i >= 0 and position < self._ends[i] else None


def _strip_sentinels(raw: str, opens: list[str], close: str) -> tuple[str, dict[int, tuple[int, int]]]:
    """Remove the sentinels, returning the clean text and each message's content range in it."""
    out: list[str] = []
    length = 0
    contents: dict[int, tuple[int, int]] = {}
    # one pattern for every open sentinel ("\ue000<nonce>:<index>\ue001") and the close: linear in the messages
    prefix = opens[0].rsplit(":", 1)[0] + ":" if opens else "\ue000"
    pattern = re.compile(re.escape(close) + "|" + re.escape(prefix) + "[0-9]+\ue001")
    open_index = {s: i for i, s in enumerate(opens)}
    current: tuple[int, int] | None = None  # (message index, start in clean text)
    cursor = 0
    for match in pattern.finditer(raw):
        out.append(raw[cursor : match.start()])
        length += match.start() - cursor
        cursor = match.end()
        token = match.group()
        if token == close:
            if current is not None:
                contents[current[0]] = (current[1], length)
                current = None
        else:
            current = (open_index[token], length)
    out.append(raw[cursor:])
    return "".join(out), contents


DEFAULT_SYSTEM = -1  # the owner of the template's own system prompt's characters (no message of the request)


def _segments(
    spans: list[tuple[int, int]],
    contents: dict[int, tuple[int, int]],
    messages: Sequence[Message],
    default_system: tuple[int, int] | None = None,
) -> list[Segment]:
    """Group consecutive tokens by what their first character belongs to."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=len(messages) - 1)
    owners = {**contents, **({DEFAULT_SYSTEM: default_system} if default_system else {})}
    lookup = _RangeLookup(list(owners.values()), list(owners))

    def owner(char: int) -> int | None:
        return lookup.find(char)

    def kind_of(index: int | None) -> SegmentKind:
        if index is None:
            return "markup"
        if index == DEFAULT_SYSTEM or messages[index]["role"] == "system":
            return "system"
        return "message" if index == last_user else "history"

    segments: list[Segment] = []
    run_start = 0
    for t in range(1, len(spans) + 1):
        if t < len(spans) and owner(spans[t][0]) == owner(spans[run_start][0]):
            continue
        index = owner(spans[run_start][0])
        segments.append(
            Segment(
                kind=kind_of(index),
                role=None if index is None else "system" if index == DEFAULT_SYSTEM else messages[index]["role"],
                message_index=None if index == DEFAULT_SYSTEM else index,
                token_start=run_start,
                token_end=t,
                char_start=spans[run_start][0],
                char_end=spans[t - 1][1],
            )
        )
        run_start = t
    return segments
