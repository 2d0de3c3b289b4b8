"""Which grammar library constrains decoding fastest here: the per-token mask cost with SmolLM2's 49k vocabulary.

For each candidate (llguidance, outlines-core, xgrammar — whichever are importable) and three
JSON schemas (a nested object, an enum, an array), it builds the grammar for the real tokenizer,
then walks the tokens of a valid answer: at every token it computes the mask of allowed tokens
(timed) and advances by that token. Printed: compile time, mask time per token p50/p99/mean, and
the whole request's grammar cost (compile plus every mask), which is what a client waits for.
Then, in the engine as served (the default weights, llguidance), the decode time per token of one
greedy answer with and without a JSON-schema grammar, and the mask time the trace reports.

    .venv/bin/python benchmarks/bench_grammar.py

xgrammar pulls transformers and triton as dependencies, so it is not in requirements.txt; to
include it, install it beside the venv without them:
    .venv/bin/pip install --no-deps --target /tmp/xg xgrammar apache-tvm-ffi && PYTHONPATH=/tmp/xg ...
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from inference.gguf_file import GGUFFile
from inference.loader import default_model_path
from inference.tokenizer import BPETokenizer

SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "nested object": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "address": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
                    "required": ["city", "zip"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "address"],
            "additionalProperties": False,
        },
        {"name": "Ada Lovelace", "address": {"city": "London", "zip": 12345}},
    ),
    "enum": (
        {
            "type": "object",
            "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
            "required": ["colour"],
            "additionalProperties": False,
        },
        {"colour": "green"},
    ),
    "array": (
        {
            "type": "object",
            "properties": {"primes": {"type": "array", "items": {"type": "integer"}}},
            "required": ["primes"],
            "additionalProperties": False,
        },
        {"primes": [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]},
    ),
}

Stepper = Callable[[int], None]  # compute the mask, then advance by the given token


def llguidance_builder(
    tok: BPETokenizer, eos: int
) -> Callable[[dict[str, Any]], tuple[Callable[[], None], Callable[[int], None]]]:
    import llguidance
    import llguidance.torch as lt

    from inference.grammar import llg_tokenizer

    lltok = llg_tokenizer(tok, eos)
    mask = lt.allocate_token_bitmask(1, tok.vocab_size)

    def build(schema: dict[str, Any]) -> tuple[Callable[[], None], Callable[[int], None]]:
        matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(schema))
        assert not matcher.is_error(), matcher.get_error()
        return (lambda: lt.fill_next_token_bitmask(matcher, mask)), (
            lambda t: None if matcher.consume_token(t) else sys.exit(matcher.get_error())
        )

    return build


def outlines_builder(
    tok: BPETokenizer, eos: int
) -> Callable[[dict[str, Any]], tuple[Callable[[], None], Callable[[int], None]]]:
    import outlines_core
    import torch

    vocab: dict[bytes, list[int]] = {}
    for i, b in enumerate(tok.token_bytes):
        if b and i != eos:
            vocab.setdefault(b, []).append(i)
    vocabulary = outlines_core.Vocabulary(eos, vocab)
    mask = torch.full(((tok.vocab_size + 31) // 32,), -1, dtype=torch.int32)

    def build(schema: dict[str, Any]) -> tuple[Callable[[], None], Callable[[int], None]]:
        regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(schema))
        guide = outlines_core.Guide(outlines_core.Index(regex, vocabulary))
        return (lambda: guide.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())), (
            lambda t: guide.advance(t)
        )

    return build


def xgrammar_builder(
    tok: BPETokenizer, eos: int
) -> Callable[[dict[str, Any]], tuple[Callable[[], None], Callable[[int], None]]]:
    import xgrammar

    info = xgrammar.TokenizerInfo(
        list(tok.token_bytes), vocab_type=xgrammar.VocabType.RAW, vocab_size=tok.vocab_size, stop_token_ids=[eos]
    )
    compiler = xgrammar.GrammarCompiler(info)
    mask = xgrammar.allocate_token_bitmask(1, tok.vocab_size)

    def build(schema: dict[str, Any]) -> tuple[Callable[[], None], Callable[[int], None]]:
        matcher = xgrammar.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema)))
        return (lambda: matcher.fill_next_token_bitmask(mask)), (
            lambda t: None if matcher.accept_token(t) else sys.exit("xgrammar refused")
        )

    return build


def main() -> None:
    import torch

    torch.set_num_threads(2)
    gguf = GGUFFile(default_model_path())
    tok = BPETokenizer(gguf.tokenizer_data())
    eos = tok.special_ids["<|im_end|>"]
    print(f"vocabulary: {tok.vocab_size} tokens; {os.cpu_count()} CPUs")
    print(
        f"{'library':<14} {'schema':<14} {'compile ms':>10} {'tokens':>6} {'mask p50 µs':>12} {'p99 µs':>8} "
        f"{'mean µs':>8} {'request ms':>10}"
    )
    for name, make in (
        ("llguidance", llguidance_builder),
        ("outlines-core", outlines_builder),
        ("xgrammar", xgrammar_builder),
    ):
        try:
            build = make(tok, eos)
        except ImportError as exc:
            print(f"{name:<14} not installed ({exc.name})")
            continue
        for label, (schema, answer) in SCHEMAS.items():
            tokens = tok.encode(json.dumps(answer)).ids
            started = time.perf_counter()
            compute, advance = build(schema)
            compile_ms = (time.perf_counter() - started) * 1000
            times = []
            for token in tokens:
                t0 = time.perf_counter()
                compute()
                times.append((time.perf_counter() - t0) * 1e6)
                advance(token)
            times.sort()
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
            print(
                f"{name:<14} {label:<14} {compile_ms:>10.1f} {len(tokens):>6} {statistics.median(times):>12.1f} "
                f"{p99:>8.1f} {statistics.mean(times):>8.1f} {compile_ms + sum(times) / 1000:>10.2f}"
            )
    in_the_engine()


def in_the_engine() -> None:
    """Decode ms/token for the same question with and without a grammar, through the real pipeline."""
    from inference.chat_template import Message
    from inference.loader import load_model
    from inference.params import SamplingParams
    from inference.pipeline import ChatPipeline
    from inference.trace import Finished, Sampled, TraceLevel

    pipeline = ChatPipeline(load_model())
    schema = {
        **SCHEMAS["nested object"][0],
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    }
    question: list[Message] = [
        {"role": "user", "content": "Who was Ada Lovelace and where did she live? Answer in JSON."}
    ]
    print("\nin the engine (" + pipeline.loaded.weights_description + "), one greedy answer, decode ms per token:")
    for label, grammar in (("free text", None), ("JSON schema", "start: %json " + json.dumps(schema))):
        best = None
        for _ in range(5):
            request = pipeline.prepare(question, SamplingParams(temperature=0, max_tokens=60, grammar=grammar))
            events = list(pipeline.stream(request, TraceLevel.SUMMARY))
            done = next(e for e in events if isinstance(e, Finished))
            masks = [e.detail.mask_seconds for e in events if isinstance(e, Sampled) and e.detail is not None]
            per_token = done.timings.decode / max(1, done.completion_tokens - 1) * 1000
            best = per_token if best is None else min(best, per_token)
        print(f"  {label:<12} {best:6.2f} ms/token   mask {statistics.mean(masks) * 1e6:6.1f} µs/token (trace)")


if __name__ == "__main__":
    main()
