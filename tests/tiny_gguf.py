"""Writes small GGUF files with random weights, for fast tests: any architecture we run, with its real tensor names
and metadata keys (`architecture`, and the family's extra tensors: biases, QK-norms, post-norms, `rope_freqs`).

The vocabulary is byte-level BPE like SmolLM2's: three ChatML control tokens, the 256
byte symbols, and a handful of merges, so multi-byte characters split across tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType, TokenType
from gguf.quants import quantize

from inference.chat_template import CHATML_TEMPLATE
from inference.config import FAMILIES
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
    tokenizer_model: str = "gpt2"
    omit_tensors: list[str] = field(default_factory=list)
    seed: int = 0
    head_dim: int | None = None  # written as `attention.key_length` when set (else dim / n_heads)
    sliding_window: int = 0  # `attention.sliding_window` (the family says which layers use it)
    rope_freqs: bool = False  # Llama 3.x's `rope_freqs.weight`, a divisor per frequency
    rope_scaling: float = 0.0  # a linear `rope.scaling.factor` when set


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
    head_dim = s.head_dim or s.dim // s.n_heads
    family = FAMILIES.get(s.architecture, FAMILIES["llama"])
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
    if s.head_dim:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if s.sliding_window:
        writer.add_sliding_window(s.sliding_window)
    if s.rope_scaling:
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(s.rope_scaling)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model(s.tokenizer_model)
    writer.add_tokenizer_pre(s.tokenizer_pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if s.chat_template is not None:
        writer.add_chat_template(s.chat_template)

    def add(name: str, shape: tuple[int, ...], scale: float, qtype: GGMLQuantizationType, mean: float = 0.0) -> None:
        if name in s.omit_tensors:
            return
        values = (mean + rng.standard_normal(shape) * scale).astype(np.float32)
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
        if family.qkv_bias:
            for name, rows in (("q", s.n_heads), ("k", s.n_kv_heads), ("v", s.n_kv_heads)):
                add(f"blk.{i}.attn_{name}.bias", (rows * head_dim,), 0.5, f32)
        if family.qk_norm:
            add(f"blk.{i}.attn_q_norm.weight", (head_dim,), 0.3, f32, mean=1.0)
            add(f"blk.{i}.attn_k_norm.weight", (head_dim,), 0.3, f32, mean=1.0)
        if family.post_norms:
            add(f"blk.{i}.post_attention_norm.weight", (s.dim,), 0.3, f32, mean=1.0)
            add(f"blk.{i}.post_ffw_norm.weight", (s.dim,), 0.3, f32, mean=1.0)
    add("output_norm.weight", (s.dim,), 0.1, f32)
    if s.rope_freqs:
        writer.add_tensor("rope_freqs.weight", rng.uniform(1.0, 8.0, head_dim // 2).astype(np.float32))
    if not s.tied_embeddings:
        add("output.weight", (len(tokens), s.dim), s.dim**-0.5, s.linear_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
