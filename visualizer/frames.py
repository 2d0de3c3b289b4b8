"""What the page may send over its socket, typed: every field of every frame checked (booleans are booleans, ids are
ids), so a frame the page would never send gets the gateway's 400 naming the field, not a guess.

The chat frame's `messages` and `params` are checked by the chat API's own request model afterwards
(`webapp.api.protocol.ChatCompletionRequest`), since they become exactly that request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from webapp.api.protocol import SamplingFields, StrictModel

MAX_IDS = 1_000_000  # the worker checks ids against its vocabulary and context length
TokenId = Annotated[int, Field(ge=0)]
Ids = Annotated[list[TokenId], Field(min_length=1, max_length=MAX_IDS)]
ModelName = Annotated[str, Field(min_length=1, max_length=200)]
ParamName = Literal[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "logit_bias",
    "response_format",
]


MessageId = Annotated[int, Field(ge=1)]


class ChatFrame(StrictModel):
    """{"type": "chat", "messages", "params", "level", "step", "continue_final_message", and where the turn is kept:
    "conversation", "parent", "answer_to", "extend"}: one turn; with "prompt" instead of "messages", the page's
    "complete this text" mode: the text as it is, without the chat template (what a base model is made for)."""

    type: Literal["chat"]
    model: ModelName = "default"
    messages: Any = None  # the chat request's own model checks these
    prompt: Annotated[str, Field(min_length=1)] | None = None
    params: dict[ParamName, Any] = Field(default_factory=dict)
    level: Literal["summary", "full"] = "summary"
    step: bool = False  # step mode: the server pauses after each token until a "next" frame
    continue_final_message: bool | None = None  # a branch or a continuation: the last message is the answer so far
    conversation: Annotated[int, Field(ge=1)] | None = None  # the kept conversation to add this exchange to
    parent: MessageId | None = None  # a new question follows this message (none: the conversation's start)
    answer_to: MessageId | None = None  # regenerate or branch: another answer to this kept question
    extend: MessageId | None = None  # continue: this kept answer goes on

    @model_validator(mode="after")
    def _one_placement(self) -> ChatFrame:
        if self.answer_to is not None and self.extend is not None:
            raise ValueError("give answer_to (another answer) or extend (more of one), not both")
        if self.extend is not None and not self.continue_final_message:
            raise ValueError("extend continues the last message: it needs continue_final_message")
        if self.prompt is not None and (self.messages is not None or self.continue_final_message):
            raise ValueError("give prompt (text to complete) or messages (a chat), not both")
        return self


class InspectFrame(StrictModel):
    """{"type": "inspect", "model", "ids", "step"}: the full-level detail of the last of `ids`, recomputed."""

    type: Literal["inspect"]
    model: ModelName = "default"
    ids: Ids
    step: int | None = None  # echoed, so the page knows which step the answer is about


class MergesFrame(StrictModel):
    """{"type": "merges", "model", "text"}: how BPE builds the tokens of a word (or a few), merge by merge."""

    type: Literal["merges"]
    model: ModelName = "default"
    text: Annotated[str, Field(min_length=1, max_length=200)]


class CompareFrame(StrictModel):
    """{"type": "compare", "models": [a, b], "text"}: one text read by two models, their tokens and next tokens."""

    type: Literal["compare"]
    models: Annotated[list[ModelName], Field(min_length=2, max_length=2)]
    text: Annotated[str, Field(min_length=1, max_length=2000)]


class PromptAttentionFrame(StrictModel):
    """{"type": "prompt_attention", "model", "ids", "layer"}: one layer's whole token x token matrix."""

    type: Literal["prompt_attention"]
    model: ModelName = "default"
    ids: Ids
    layer: Annotated[int, Field(ge=0)]


class ResampleFrame(SamplingFields):
    """{"type": "resample", "model", "step", "prompt_ids", "generated", and the sampling fields to change}."""

    type: Literal["resample"]
    model: ModelName = "default"
    step: int | None = None
    prompt_ids: Ids
    generated: list[TokenId] = Field(default_factory=list, max_length=MAX_IDS)
