"""Model hyper-parameters, read from a GGUF file's metadata rather than hard-coded.

One `ModelConfig` describes every architecture we run. What differs between families is data here, not branches in
`inference.model`: which norms a layer has, whether its projections carry biases, the activation of its gated
feed-forward, how RoPE pairs features, which layers see only a sliding window and with which RoPE base. `FAMILIES`
holds what a family's files do not say about themselves (llama.cpp hard-codes the same facts in `llama-model.cpp`):

- `llama` (SmolLM2, Llama 2 and 3.x): pre-norm SwiGLU; llama.cpp's converter permuted Q and K so RoPE turns adjacent
  pairs; Llama 3.x files carry `rope_freqs.weight`, a divisor per frequency (its long-context scaling).
- `qwen2` (Qwen 2 and 2.5): llama's layer with biases on Q, K and V, and RoPE on the two halves of each head (NeoX).
- `qwen3`: Qwen 2's layer without the biases, with QK-norm (an RMS norm over each query and key head before RoPE).
- `gemma3`: the embedding scaled by sqrt(width); norms before and after each sublayer; QK-norm; a GELU-gated
  feed-forward (tanh approximation); NeoX RoPE; five of every six layers attend only to the last `sliding_window`
  positions, with RoPE base 10,000 where the global ones use the file's. The file's norm weights already hold
  Gemma's "1 + weight" (llama.cpp's converter adds the 1), so every norm is the plain x / rms(x) * weight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inference.errors import ModelFileError


@dataclass(frozen=True)
class Family:
    """What an architecture's GGUF metadata leaves implicit."""

    rope_halves: bool = False  # NeoX RoPE: feature i turns with i + rope_dim / 2 (else adjacent pairs 2i, 2i + 1)
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False  # an RMS norm on each sublayer's output before it joins the residual stream
    activation: str = "silu"  # of the feed-forward's gate: "silu" (SwiGLU) or "gelu" (GeGLU, tanh approximation)
    scale_embedding: bool = False  # multiply embeddings by sqrt(dim)
    window_every: int = 0  # with a sliding window: every n-th layer (n - 1, 2n - 1, ...) is global, the rest local
    local_rope_base: float | None = None  # the local layers' RoPE base (None: the file's)


FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "qwen2": Family(rope_halves=True, qkv_bias=True),
    "qwen3": Family(rope_halves=True, qk_norm=True),
    "gemma3": Family(
        rope_halves=True,
        qk_norm=True,
        post_norms=True,
        activation="gelu",
        scale_embedding=True,
        window_every=6,
        local_rope_base=10000.0,
    ),
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)


@dataclass(frozen=True)
class ModelConfig:
    """Everything the transformer needs to know about its shape and its architecture's choices."""

    architecture: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    rope_base: float
    rope_dim: int
    norm_eps: float
    name: str = ""
    head_dim: int = 0  # 0: dim / n_heads (files that say otherwise carry `attention.key_length`)
    family: Family = field(default_factory=Family)
    sliding_window: int = 0  # positions a local layer sees, its own included (0: every layer is global)
    rope_scale: float = 1.0  # global layers' positions are multiplied by this (linear RoPE scaling)
    local_rope_base: float = 0.0  # the sliding-window layers' RoPE base (0: `rope_base`)

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)

    @property
    def kv_group_size(self) -> int:
        """How many query heads share one key/value head (grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    @property
    def q_dim(self) -> int:
        """The width of all query heads together (not always `dim`: Gemma 3 270M has 4 heads of 256 over 640)."""
        return self.n_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        """What query . key is multiplied by: 1 / sqrt(head size) in every family here (llama.cpp's
        `f_attention_scale` for Gemma 3 below 27B)."""
        return self.head_dim**-0.5

    @property
    def embedding_scale(self) -> float:
        return math.sqrt(self.dim) if self.family.scale_embedding else 1.0

    def window(self, layer: int) -> int:
        """How many positions `layer` sees (its own included); 0 for all of them."""
        every = self.family.window_every
        if not self.sliding_window or not every:
            return 0
        return self.sliding_window if layer % every < every - 1 else 0

    def rope_base_for(self, layer: int) -> float:
        return self.local_rope_base if self.window(layer) and self.local_rope_base else self.rope_base

    @property
    def has_local_layers(self) -> bool:
        return any(self.window(layer) for layer in range(self.n_layers))

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], path: str, vocab_size: int) -> ModelConfig:
        """Build the config from `<arch>.*` keys; a missing key names the file and the key."""
        arch = meta.get("general.architecture")
        if arch not in FAMILIES:
            raise ModelFileError(
                path, f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )

        def need(key: str) -> Any:
            full = f"{arch}.{key}"
            if full not in meta:
                raise ModelFileError(path, f"metadata key {full!r} is missing")
            return meta[full]

        dim = int(need("embedding_length"))
        n_heads = int(need("attention.head_count"))
        n_kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", n_heads))
        head_dim = int(meta.get(f"{arch}.attention.key_length", dim // n_heads))
        if int(meta.get(f"{arch}.attention.value_length", head_dim)) != head_dim:
            raise ModelFileError(path, "keys and values of different sizes are not supported")
        if n_heads % n_kv_heads:
            raise ModelFileError(path, f"inconsistent heads: {n_heads} heads, {n_kv_heads} KV heads")
        scaling = str(meta.get(f"{arch}.rope.scaling.type", "none"))
        factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
        if scaling not in ("none", "linear") and factor != 1.0:
            raise ModelFileError(path, f"RoPE scaling {scaling!r} is not supported (linear is)")
        return cls(
            architecture=str(arch),
            n_layers=int(need("block_count")),
            dim=dim,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            ffn_dim=int(need("feed_forward_length")),
            vocab_size=int(meta.get(f"{arch}.vocab_size", vocab_size)),
            context_length=int(need("context_length")),
            rope_base=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_dim=int(meta.get(f"{arch}.rope.dimension_count", head_dim)),
            norm_eps=float(need("attention.layer_norm_rms_epsilon")),
            name=str(meta.get("general.name", "")),
            head_dim=head_dim,
            family=FAMILIES[str(arch)],
            sliding_window=int(meta.get(f"{arch}.attention.sliding_window", 0)),
            rope_scale=1.0 / factor if scaling == "linear" else 1.0,
            local_rope_base=float(meta.get(f"{arch}.rope.freq_base_swa", FAMILIES[str(arch)].local_rope_base or 0.0)),
        )
