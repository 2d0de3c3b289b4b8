"""Writes small LLaMA-architecture GGUF files with random weights, for fast tests.

The vocabulary is byte-level BPE like SmolLM2's: three ChatML control tokens, the 256
byte symbols, and a handful of merges, so multi-byte characters split across tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize

from inference.chat_template import CHATML_TEMPLATE
from inference.tokenizer import unicode_to_byte

CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "o u", "Ġ i", "e r", "a n", "Ġ s"]
FP16_FIELDS_OK = 0x3B  # bytes at most this value make any fp16 built from them finite and below 1


@dataclass
class TinySpec:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 96
    context_length: int = 256
    rope_base: float = 10000.0
    linear_type: GGMLQuantizationType = GGMLQuantizationType.F32
    tied_embeddings: bool = True
    architecture: str = "llama"
    chat_template: str | None = CHATML_TEMPLATE
    tokenizer_pre: str = "smollm"
    omit_tensors: list[str] = field(default_factory=list)
    seed: int = 0


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): control tokens, the 256 byte symbols, then the merged tokens."""
    symbols = sorted(unicode_to_byte(), key=lambda ch: unicode_to_byte()[ch])
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = CONTROL_TOKENS + symbols + merged
    types = [int(TokenType.CONTROL)] * len(CONTROL_TOKENS) + [int(TokenType.NORMAL)] * (len(symbols) + len(merged))
    return tokens, types, MERGES


def _encode_tensor(rng: np.random.Generator, values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    if qtype == GGMLQuantizationType.F32:
        return values.astype(np.float32)
    if qtype == GGMLQuantizationType.F16:
        return values.astype(np.float16)
    try:
        return quantize(values, qtype)
    except NotImplementedError:
        # No Python quantizer for this type (the K-quants): random blocks whose fp16 fields are finite.
        from gguf.constants import GGML_QUANT_SIZES

        block, size = GGML_QUANT_SIZES[qtype]
        rows, cols = values.shape
        return rng.integers(0, FP16_FIELDS_OK + 1, size=(rows, cols // block * size), dtype=np.uint8)


def write_tiny_gguf(path: Path, spec: TinySpec | None = None) -> Path:
    """Write the model described by `spec` to `path` and return the path."""
    s = spec or TinySpec()
    rng = np.random.default_rng(s.seed)
    tokens, types, merges = vocabulary()
    head_dim = s.dim // s.n_heads
    writer = GGUFWriter(str(path), s.architecture)
    writer.add_name("tiny-test-model")
    writer.add_block_count(s.n_layers)
    writer.add_context_length(s.context_length)
    writer.add_embedding_length(s.dim)
    writer.add_feed_forward_length(s.ffn_dim)
    writer.add_head_count(s.n_heads)
    writer.add_head_count_kv(s.n_kv_heads)
    writer.add_rope_freq_base(s.rope_base)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(s.tokenizer_pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if s.chat_template is not None:
        writer.add_chat_template(s.chat_template)

    def add(name: str, shape: tuple[int, ...], scale: float, qtype: GGMLQuantizationType) -> None:
        if name in s.omit_tensors:
            return
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        data = _encode_tensor(rng, values, qtype)
        writer.add_tensor(
            name, data, raw_dtype=None if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) else qtype
        )

    f32 = GGMLQuantizationType.F32
    add("token_embd.weight", (len(tokens), s.dim), 1.0, s.linear_type)
    for i in range(s.n_layers):
        add(f"blk.{i}.attn_norm.weight", (s.dim,), 0.1, f32)
        add(f"blk.{i}.attn_q.weight", (s.n_heads * head_dim, s.dim), s.dim**-0.5, s.linear_type)
        add(f"blk.{i}.attn_k.weight", (s.n_kv_heads * head_dim, s.dim), s.dim**-0.5, s.linear_type)
        add(f"blk.{i}.attn_v.weight", (s.n_kv_heads * head_dim, s.dim), s.dim**-0.5, s.linear_type)
        add(f"blk.{i}.attn_output.weight", (s.dim, s.n_heads * head_dim), s.dim**-0.5, s.linear_type)
        add(f"blk.{i}.ffn_norm.weight", (s.dim,), 0.1, f32)
        add(f"blk.{i}.ffn_gate.weight", (s.ffn_dim, s.dim), s.dim**-0.5, s.linear_type)
        add(f"blk.{i}.ffn_up.weight", (s.ffn_dim, s.dim), s.dim**-0.5, s.linear_type)
        add(f"blk.{i}.ffn_down.weight", (s.dim, s.ffn_dim), s.ffn_dim**-0.5, s.linear_type)
    add("output_norm.weight", (s.dim,), 0.1, f32)
    if not s.tied_embeddings:
        add("output.weight", (len(tokens), s.dim), s.dim**-0.5, s.linear_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
