"""The errors the inference core raises; each carries a message a user can act on."""

from __future__ import annotations


class InferenceError(Exception):
    """Base class: anything the core rejects on purpose."""


class ModelFileError(InferenceError):
    """The model file cannot be used; the message names the file and what is wrong with it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class InvalidRequestError(InferenceError):
    """A request parameter is impossible (negative temperature, top_p above 1, ...)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthExceededError(InvalidRequestError):
    """The prompt plus the room asked for the answer does not fit in the model's context."""

    def __init__(self, prompt_tokens: int, max_tokens: int, limit: int) -> None:
        super().__init__(
            f"This model's maximum context length is {limit} tokens; the messages use {prompt_tokens} tokens"
            f" and {max_tokens} more were asked for the completion. Shorten the messages or lower max_tokens.",
            param="messages",
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.limit = limit


class PromptFarTooLongError(ContextLengthExceededError):
    """Found before rendering: so many messages or characters that no tokenization could fit (a cheap first check)."""

    def __init__(self, what: str, limit: int) -> None:
        InvalidRequestError.__init__(
            self,
            f"This model's maximum context length is {limit} tokens, and {what} cannot fit in it. "
            "Shorten the messages.",
            param="messages",
        )
        self.prompt_tokens, self.max_tokens, self.limit = limit + 1, 0, limit
