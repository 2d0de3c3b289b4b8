"""One-shot questions a worker answers beside generation, each with one reply: a typed dispatch table.

Tokenize and detokenize need only the tokenizer and template (no torch): they are answered on the worker's prepare
thread, so a long text never stalls the decode loop. The page's what-if tools recompute a prompt through the model
(`inference.what_if`): they run on the engine thread between steps, as all torch work does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from inference import what_if
from inference.bpe_merges import merge_steps
from inference.chat_template import Message
from inference.errors import InvalidRequestError
from inference.loader import LoadedModel
from inference.trace import Sampled
from webapp.worker import serialize, wire

log = logging.getLogger("roundtrip.worker")
PROMPT_MATRIX_POSITIONS = 256  # the prompt's token x token matrix covers at most its first this many positions
INSPECT_BUDGET_POSITIONS = 2048  # asked for on purpose, one token at a time: a bigger budget than live frames


def tokenize(loaded: LoadedModel, question: wire.Tokenize) -> wire.Tokens:
    """Ids, token strings and spans of plain `text`, or of `messages` (and `tools`) rendered with the template."""
    if question.messages is not None:
        prompt = loaded.chat_template.render(cast(list[Message], question.messages), tools=question.tools)
        return wire.Tokens(
            request_id=question.request_id,
            ids=prompt.ids,
            tokens=prompt.tokens,
            spans=list(prompt.spans),
            text=prompt.text,
            segments=serialize.segments(prompt.segments),
        )
    encoded = loaded.tokenizer.encode(question.text or "")
    return wire.Tokens(
        request_id=question.request_id, ids=encoded.ids, tokens=encoded.tokens, spans=list(encoded.spans)
    )


def detokenize(loaded: LoadedModel, question: wire.Detokenize) -> wire.Detokenized:
    vocab = loaded.tokenizer.vocab_size
    if any(not 0 <= i < vocab for i in question.ids):
        raise InvalidRequestError(f"'tokens' must be token ids below {vocab}", "tokens")
    return wire.Detokenized(
        request_id=question.request_id, text=loaded.tokenizer.decode(question.ids, control_text=True)
    )


def merges(loaded: LoadedModel, question: wire.Merges) -> wire.MergeSteps:
    """The merges that turn each piece of the text into its tokens."""
    pieces = [
        wire.PieceMerges(
            text=p.text,
            start=p.start,
            merges=[wire.MergeStep(rank=m.rank, pair=m.pair, symbols=m.symbols) for m in p.merges],
            ids=p.ids,
        )
        for p in merge_steps(loaded.tokenizer, question.text)
    ]
    return wire.MergeSteps(request_id=question.request_id, pieces=pieces, tokenizer=loaded.tokenizer.kind)


def inspect(loaded: LoadedModel, question: wire.Inspect) -> wire.Inspection:
    """The full-level detail for the last position of the given ids, recomputed."""
    detail = what_if.inspect(loaded.model, checked_ids(loaded, question.ids, "ids"))
    return wire.Inspection(
        request_id=question.request_id,
        detail=serialize.layer_detail(detail, loaded.tokenizer, INSPECT_BUDGET_POSITIONS),
    )


def prompt_attention(loaded: LoadedModel, question: wire.PromptAttention) -> wire.PromptAttentionMatrix:
    """The prompt recomputed with every position's attention at one layer: the whole matrix."""
    ids = checked_ids(loaded, question.ids, "ids")[:PROMPT_MATRIX_POSITIONS]
    weights = what_if.prompt_attention(loaded.model, ids, question.layer)
    return wire.PromptAttentionMatrix(
        request_id=question.request_id, attention=serialize.attention_rows(weights.numpy(), PROMPT_MATRIX_POSITIONS)
    )


def resample(loaded: LoadedModel, question: wire.Resample) -> wire.Resampled:
    """A past step drawn again with other settings, from its real logits, as the sampled event a live step sends."""
    prompt = checked_ids(loaded, question.prompt_ids, "prompt_ids")
    generated = checked_ids(loaded, question.generated, "generated", at_least=0, before=len(prompt))
    sample = what_if.resample(loaded.model, loaded.stop_ids, prompt, generated, question.params)
    event = Sampled(
        time.perf_counter(),
        len(generated) + 1,
        sample.token_id,
        sample.logprob,
        sample.rank,
        sample.token_id in loaded.stop_ids,
        0.0,
        sample.top_logprobs,
        sample.detail,
    )
    return wire.Resampled(request_id=question.request_id, event=serialize.sampled(event, loaded.tokenizer))


NEXT_TOKENS = 10  # the likeliest next tokens a comparison shows


def next_tokens(loaded: LoadedModel, question: wire.NextTokens) -> wire.NextTokenView:
    """The text's tokens and the model's likeliest next tokens after it, the text read raw (`ChatTemplate.plain`)."""
    prompt = loaded.chat_template.plain(question.text)
    checked_ids(loaded, prompt.ids, "text")
    shift = len(prompt.text) - len(question.text)  # the BOS the model puts in front is no character of the text
    tokenizer = loaded.tokenizer
    return wire.NextTokenView(
        request_id=question.request_id,
        ids=prompt.ids,
        tokens=[tokenizer.token_text(i) for i in prompt.ids],
        pieces=[tokenizer.pieces[i] for i in prompt.ids],
        spans=[(max(0, a - shift), max(0, b - shift)) for a, b in prompt.spans],
        likely=[
            wire.Likely(token_id=i, token=tokenizer.token_text(i), prob=p)
            for i, p in what_if.likeliest(loaded.model, prompt.ids, NEXT_TOKENS)
        ],
        tokenizer=tokenizer.kind,
    )


def checked_ids(loaded: LoadedModel, ids: list[int], name: str, at_least: int = 1, before: int = 0) -> list[int]:
    """Token ids from a question: at least `at_least` ids of this vocabulary that fit the context after `before`
    others; InvalidRequestError naming the field otherwise."""
    config = loaded.config
    room = config.context_length - before
    if not at_least <= len(ids) <= room or not all(0 <= i < config.vocab_size for i in ids):
        raise InvalidRequestError(f"'{name}' must be {at_least} to {room} token ids below {config.vocab_size}", name)
    return ids


@dataclass(frozen=True)
class Handler:
    answer: Callable[[LoadedModel, Any], wire.AnyReply]
    needs_model: bool  # runs the model: answered on the engine thread between steps, else on the prepare thread


HANDLERS: dict[type[wire.OneShot], Handler] = {
    wire.Tokenize: Handler(tokenize, needs_model=False),
    wire.Detokenize: Handler(detokenize, needs_model=False),
    wire.Merges: Handler(merges, needs_model=False),
    wire.Inspect: Handler(inspect, needs_model=True),
    wire.PromptAttention: Handler(prompt_attention, needs_model=True),
    wire.Resample: Handler(resample, needs_model=True),
    wire.NextTokens: Handler(next_tokens, needs_model=True),
}


def answer(loaded: LoadedModel, question: wire.OneShot) -> wire.AnyReply:
    """The question's answer, or the error that stopped it (a bad request, in the asker's words)."""
    try:
        return HANDLERS[type(question)].answer(loaded, question)
    except Exception as exc:  # a question the model cannot answer fails alone
        if not isinstance(exc, InvalidRequestError):
            log.exception("answering %s %s failed", type(question).__name__, question.request_id)
        return wire.error_reply(question.request_id, exc)
