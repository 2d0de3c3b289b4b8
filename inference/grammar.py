"""Grammar-constrained decoding: before each draw, the tokens that would break the grammar are removed.

Backed by llguidance, chosen by measurement (`benchmarks/bench_grammar.py`: its per-token mask
with SmolLM2's 49k vocabulary costs tens of microseconds and needs no compile step, where
outlines-core first builds an index over the whole vocabulary for every schema, and xgrammar
would pull transformers and triton into the worker). A `Grammar` belongs to one sequence: it
writes the allowed-token bitmask, is told every token drawn, and says when the text is complete
(then only end-of-turn may follow).

Grammars arrive as text in llguidance's Lark dialect (JSON schemas embedded as `%json {...}`), built
by the web side without this library, so they travel through `SamplingParams` as a plain string.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from functools import lru_cache

import llguidance

# not llguidance.torch: importing it compiles a kernel (dynamo, inductor: +130 MB, 3 s)
import llguidance.numpy as llg_numpy
import numpy as np
import torch
from torch import Tensor

from inference.errors import InvalidRequestError
from inference.tokenizer import Tokenizer

SPECIAL_PREFIX = b"\xff"  # how llguidance tells control tokens from text


class _Wrapper:
    """The tokenizer as llguidance asks for it: every token's bytes, control tokens marked, and an encoder."""

    def __init__(self, tokenizer: Tokenizer, eos: int) -> None:
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = sorted(tokenizer.control_ids)
        self.tokens = [
            SPECIAL_PREFIX + tokenizer.pieces[i].encode() if i in tokenizer.control_ids else tokenizer.token_bytes[i]
            for i in range(tokenizer.vocab_size)
        ]
        self._tokenizer = tokenizer
        self.is_tokenizer_wrapper = True

    def __call__(self, text: str | bytes) -> list[int]:
        return self._tokenizer.encode(text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text).ids


_tokenizers: weakref.WeakKeyDictionary[Tokenizer, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()


def llg_tokenizer(tokenizer: Tokenizer, eos: int) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer`, built once per tokenizer (~0.1 s for 49k tokens)."""
    if tokenizer not in _tokenizers:
        _tokenizers[tokenizer] = llguidance.LLTokenizer(_Wrapper(tokenizer, eos))  # type: ignore[arg-type]
    return _tokenizers[tokenizer]


def _first_line(report: str) -> str:
    """llguidance's report, cut to its first line: the rest holds the grammar and the parser's state, which a client
    does not need and a log must not keep."""
    return report.strip().splitlines()[0][:200] if report.strip() else "no reason given"


@lru_cache(maxsize=256)
def compile_lark(lark: str) -> str:
    """llguidance's grammar for Lark text; InvalidRequestError naming response_format when it cannot be used
    (a client's JSON schema with a feature the compiler does not support, say)."""
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if error:
        raise InvalidRequestError(
            f"This schema cannot be used for constrained decoding: {_first_line(messages[0])}", "response_format"
        )
    return grammar


class Grammar:
    """One sequence's matcher: the allowed tokens before each draw, advanced by every token drawn."""

    def __init__(self, lark: str, tokenizer: Tokenizer, eos: int, stop_ids: Sequence[int]) -> None:
        self._matcher = llguidance.LLMatcher(llg_tokenizer(tokenizer, eos), compile_lark(lark), log_level=0)
        if self._matcher.is_error():
            raise InvalidRequestError(
                f"The grammar cannot be used: {_first_line(self._matcher.get_error())}", "response_format"
            )
        self.vocab_size = tokenizer.vocab_size
        self._bits = llg_numpy.allocate_token_bitmask(1, tokenizer.vocab_size)
        self._eos = eos
        self._stop_ids = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
        self.mask_seconds = 0.0  # the latest mask's cost, for the trace

    def allowed(self) -> Tensor:
        """A bool tensor [V]: which tokens may come next. Once the grammar is complete, only end-of-turn tokens."""
        started = time.perf_counter()
        llg_numpy.fill_next_token_bitmask(self._matcher, self._bits)
        if self._matcher.is_error():
            raise self._failed()
        bits = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")  # [V/32] words -> [V rounded up] bits
        allowed = torch.from_numpy(bits.view(np.bool_))[: self.vocab_size]
        if bool(allowed[self._eos]):  # the text is complete: any end-of-turn token ends it
            allowed[self._stop_ids] = True
        self.mask_seconds = time.perf_counter() - started
        return allowed

    def advance(self, token: int) -> None:
        """Tell the matcher which token was drawn (end-of-turn tokens count as its EOS)."""
        if int(token) in self._stop_ids.tolist():
            token = self._eos
        if not self._matcher.consume_token(int(token)):
            raise self._failed()

    def _failed(self) -> InvalidRequestError:
        """The matcher gave up mid-answer (a schema past llguidance's limits, say): the request's format cannot be
        enforced. Its first line only: llguidance's full report holds the grammar and the parser's state."""
        first = _first_line(self._matcher.get_error() or "")
        return InvalidRequestError(f"The response format cannot be enforced on this answer: {first}", "response_format")

    @property
    def complete(self) -> bool:
        """No more text can follow: the sequence should end now."""
        return self._matcher.is_stopped()
