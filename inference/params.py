"""What a request asks of the sampler, validated: plain Python, no torch.

The web side builds these from API requests and checks them before anything reaches a
worker, so this module must stay importable without torch (a test asserts it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inference.errors import InvalidRequestError

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 4


@dataclass(frozen=True)
class SamplingParams:
    """A request's sampling settings; `validate` rejects impossible values with the parameter's name."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0
    ignore_eos: bool = False  # keep going past end-of-turn tokens: fixed output lengths for benchmarks
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), OpenAI's -100..100
    grammar: str | None = None  # Lark text (llguidance's dialect, JSON schemas as %json): only what it allows is drawn

    def validate(self, vocab_size: int | None = None) -> None:
        """Every value in its range; with `vocab_size`, every token id (logit_bias) in the model's vocabulary too."""

        def bad(param: str, rule: str) -> InvalidRequestError:
            return InvalidRequestError(f"{param} must be {rule}, got {getattr(self, param)!r}", param)

        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 2.0):
            raise bad("temperature", "between 0 and 2")
        if self.top_k < 0:
            raise bad("top_k", "0 (off) or a positive integer")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise bad("top_p", "greater than 0 and at most 1")
        if not (math.isfinite(self.min_p) and 0.0 <= self.min_p <= 1.0):
            raise bad("min_p", "between 0 and 1")
        if not (math.isfinite(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 10.0):
            raise bad("repetition_penalty", "greater than 0 and at most 10")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2.0 <= value <= 2.0):
                raise bad(name, "between -2 and 2")
        if self.seed is not None and not (-(2**63) <= self.seed < 2**64):
            raise bad("seed", "a 64-bit integer")
        if self.max_tokens < 1:
            raise bad("max_tokens", "at least 1")
        if len(self.stop) > MAX_STOP_STRINGS or any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError(f"stop must be up to {MAX_STOP_STRINGS} non-empty strings", "stop")
        if any(not (math.isfinite(b) and -100 <= b <= 100) or token < 0 for token, b in self.logit_bias):
            raise InvalidRequestError(
                "logit_bias values must be between -100 and 100, keyed by token ids", "logit_bias"
            )
        if vocab_size is not None and any(token >= vocab_size for token, _ in self.logit_bias):
            token = max(token for token, _ in self.logit_bias)
            raise InvalidRequestError(
                f"logit_bias names token {token}, but the vocabulary has {vocab_size} tokens", "logit_bias"
            )
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise bad("top_logprobs", f"between 0 and {MAX_TOP_LOGPROBS}")
