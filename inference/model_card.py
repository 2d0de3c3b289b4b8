"""What a model is, for people: its architecture, its shape and what its family does differently, in the file's own
numbers. The page's model card and `/health` show it; nothing here is hard-coded per model, all of it comes from the
config the file gave (`inference.config`)."""

from __future__ import annotations

from dataclasses import dataclass

from inference.config import ModelConfig


@dataclass(frozen=True)
class ModelCard:
    architecture: str
    name: str
    layers: int
    width: int
    heads: int
    kv_heads: int
    head_size: int
    feed_forward: int
    vocabulary: int
    context: int
    tokenizer: str  # "byte-level BPE", "SentencePiece"
    chat_template: bool  # the file has one (else the family's, or ChatML: a base model is better completed)
    features: list[str]  # what this family does, one phrase each
    layer_windows: list[int]  # positions each layer sees (0: every position)


def model_card(config: ModelConfig, tokenizer: str, chat_template: bool) -> ModelCard:
    c, f = config, config.family
    features = [
        f"{c.n_heads} query heads share {c.n_kv_heads} key/value head{'s' if c.n_kv_heads > 1 else ''}"
        if c.n_kv_heads < c.n_heads
        else f"{c.n_heads} attention heads",
        "GELU-gated feed-forward (GeGLU)" if f.activation == "gelu" else "SiLU-gated feed-forward (SwiGLU)",
    ]
    if f.scale_embedding:
        features.append(f"embeddings scaled by √{c.dim} = {c.embedding_scale:.1f}")
    if f.post_norms:
        features.append("RMS norms before and after each sublayer")
    if f.qk_norm:
        features.append("QK-norm: each query and key head RMS-normed before RoPE")
    if f.qkv_bias:
        features.append("biases on the query, key and value projections")
    features.append(
        "RoPE on the two halves of each head (NeoX)" if f.rope_halves else "RoPE on adjacent pairs of features"
    )
    windows = [c.window(i) for i in range(c.n_layers)]
    local = sum(1 for w in windows if w)
    if local:
        features.append(
            f"{local} of {c.n_layers} layers see only the last {c.sliding_window} tokens (RoPE base "
            f"{c.local_rope_base:,.0f}); the others see everything (RoPE base {c.rope_base:,.0f})"
        )
    else:
        features.append(f"every layer sees every earlier token (RoPE base {c.rope_base:,.0f})")
    return ModelCard(
        architecture=c.architecture,
        name=c.name,
        layers=c.n_layers,
        width=c.dim,
        heads=c.n_heads,
        kv_heads=c.n_kv_heads,
        head_size=c.head_dim,
        feed_forward=c.ffn_dim,
        vocabulary=c.vocab_size,
        context=c.context_length,
        tokenizer=tokenizer,
        chat_template=chat_template,
        features=features,
        layer_windows=windows,
    )
