"""Model hyper-parameters, read from a GGUF file's metadata rather than hard-coded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inference.errors import ModelFileError

SUPPORTED_ARCHITECTURES = ("llama",)


@dataclass(frozen=True)
class ModelConfig:
    """Everything the transformer needs to know about its shape."""

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

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_group_size(self) -> int:
        """How many query heads share one key/value head (grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], path: str, vocab_size: int) -> ModelConfig:
        """Build the config from `<arch>.*` keys; a missing key names the file and the key."""
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
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
        if dim % n_heads or n_heads % n_kv_heads:
            raise ModelFileError(path, f"inconsistent heads: width {dim}, {n_heads} heads, {n_kv_heads} KV heads")
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
            rope_dim=int(meta.get(f"{arch}.rope.dimension_count", dim // n_heads)),
            norm_eps=float(need("attention.layer_norm_rms_epsilon")),
            name=str(meta.get("general.name", "")),
        )
