"""Roundtrip's inference core: plain Python and torch, no Django.

GGUF loading, tokenizer and chat template, the transformer with its KV cache,
sampling, incremental detokenization, the engine and the typed trace it yields.
"""
