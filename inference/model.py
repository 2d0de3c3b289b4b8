"""The LLaMA-family transformer, top-down, with module names that match the GGUF tensor names.

`Transformer.forward` takes a batch of sequences `[B, T]` with their positions `[B, T]`
and a `KVCache` holding one row per sequence, so the same code serves one request's
prefill, its single-token decode steps, and (later) several sequences decoded in one
batched forward. A `ForwardProbe`, when given, is shown the intermediate tensors the
trace needs at `full` level; without one the forward does no extra work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.config import ModelConfig


class ForwardProbe(Protocol):
    """Receives intermediate tensors during a forward pass (see `inference.probe`)."""

    def on_residual(self, layer: int, h: Tensor) -> None: ...

    def on_attention(self, layer: int, q: Tensor, k: Tensor, mask: Tensor) -> None: ...


class KVCache:
    """Keys and values for `batch` sequences, preallocated to `max_len` positions.

    Stored as [n_layers, batch, n_kv_heads, max_len, head_dim] so one layer's slice is
    exactly the key/value layout attention reads.
    """

    def __init__(self, config: ModelConfig, batch: int, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        shape = (config.n_layers, batch, config.n_kv_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len

    def update(self, layer: int, pos: Positions, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v [B, n_kv, T, hd] at their positions; return the cache up to the longest row."""
        rows = torch.arange(k.shape[0], device=k.device)[:, None]  # [B, 1]
        # Advanced indices around a slice put their dims first: the target view is [B, T, n_kv, hd].
        self.k[layer][rows, :, pos.input_pos] = k.transpose(1, 2)
        self.v[layer][rows, :, pos.input_pos] = v.transpose(1, 2)
        return self.k[layer, :, :, : pos.kv_len], self.v[layer, :, :, : pos.kv_len]


@dataclass(frozen=True)
class Positions:
    """Where one forward's tokens sit, computed once and shared by every layer (one host sync per forward)."""

    input_pos: Tensor  # [B, T]
    freqs: Tensor  # [B, T, rope_dim / 2] complex rotations
    mask: Tensor  # [B, 1, T, S] the query at position p sees cache slots 0..p
    kv_len: int  # S: cached positions of the longest row after this forward

    @classmethod
    def of(cls, input_pos: Tensor, freqs_cis: Tensor) -> Positions:
        kv_len = int(input_pos.max()) + 1
        slots = torch.arange(kv_len, device=input_pos.device)
        mask = (slots[None, None, :] <= input_pos[:, :, None])[:, None]  # [B, 1, T, S]
        return cls(input_pos, freqs_cis[input_pos], mask, kv_len)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def rope_frequencies(config: ModelConfig, device: torch.device) -> Tensor:
    """Complex rotations [context_length, rope_dim / 2] for every position."""
    half = config.rope_dim // 2
    inv_freq = 1.0 / (config.rope_base ** (torch.arange(0, half, dtype=torch.float64, device=device) * 2 / config.rope_dim))
    angles = torch.outer(torch.arange(config.context_length, dtype=torch.float64, device=device), inv_freq)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def apply_rope(x: Tensor, freqs: Tensor) -> Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]): llama.cpp's converter permuted Q and K for this layout.

    x: [B, T, H, hd]; freqs: [B, T, rope_dim / 2].
    """
    rot = freqs.shape[-1] * 2
    pairs = x[..., :rot].float().reshape(*x.shape[:-1], -1, 2)  # [B, T, H, rot/2, 2]
    rotated = torch.view_as_complex(pairs) * freqs[:, :, None, :]  # [B, T, H, rot/2]
    out = torch.view_as_real(rotated).flatten(-2)  # [B, T, H, rot]
    return torch.cat([out.to(x.dtype), x[..., rot:]], dim=-1)


class Block(nn.Module):
    """One transformer layer; attribute names are the GGUF's `blk.N.*` tensor names."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = self.config = config
        self.attn_norm = RMSNorm(c.dim, c.norm_eps)
        self.attn_q = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.attn_k = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.attn_v = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.attn_output = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)
        self.ffn_gate = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.ffn_up = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.ffn_down = nn.Linear(c.ffn_dim, c.dim, bias=False)

    def forward(self, x: Tensor, pos: Positions, cache: KVCache, layer: int, probe: ForwardProbe | None) -> Tensor:
        h = x + self.attention(self.attn_norm(x), pos, cache, layer, probe)
        return h + self.feed_forward(self.ffn_norm(h))

    def attention(self, x: Tensor, pos: Positions, cache: KVCache, layer: int, probe: ForwardProbe | None) -> Tensor:
        """Grouped-query attention over the cache: 9 query heads share 3 key/value heads in SmolLM2."""
        c = self.config
        B, T, _ = x.shape
        q = self.attn_q(x).view(B, T, c.n_heads, c.head_dim)  # [B, T, H, hd]
        k = self.attn_k(x).view(B, T, c.n_kv_heads, c.head_dim)  # [B, T, KV, hd]
        v = self.attn_v(x).view(B, T, c.n_kv_heads, c.head_dim)  # [B, T, KV, hd]
        q, k = apply_rope(q, pos.freqs), apply_rope(k, pos.freqs)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, T, hd]
        keys, values = cache.update(layer, pos, k, v)  # [B, KV, S, hd]
        if probe is not None:
            probe.on_attention(layer, q, keys, pos.mask)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=pos.mask, enable_gqa=True)  # [B, H, T, hd]
        return self.attn_output(y.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim))  # [B, T, dim]

    def feed_forward(self, x: Tensor) -> Tensor:
        """SwiGLU: down(silu(gate(x)) * up(x))."""
        return self.ffn_down(F.silu(self.ffn_gate(x)) * self.ffn_up(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embd = nn.Embedding(config.vocab_size, config.dim)
        self.blk = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.output_norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        # A plain attribute, not a buffer: Module.to(dtype) would cast the complex rotations to real.
        self.freqs_cis = rope_frequencies(config, torch.device("cpu"))

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        weight = self.token_embd.weight
        return KVCache(self.config, batch, min(max_len, self.config.context_length), weight.device, weight.dtype)

    def forward(
        self,
        tokens: Tensor,
        input_pos: Tensor,
        cache: KVCache,
        probe: ForwardProbe | None = None,
        all_logits: bool = False,
    ) -> Tensor:
        """tokens, input_pos: [B, T]. Returns float32 logits [B, V] for the last position, or [B, T, V]."""
        x = self.token_embd(tokens)  # [B, T, dim]
        if self.freqs_cis.device != tokens.device:
            self.freqs_cis = self.freqs_cis.to(tokens.device)
        pos = Positions.of(input_pos, self.freqs_cis)
        for layer, block in enumerate(self.blk):
            if probe is not None:
                probe.on_residual(layer, x)
            x = block(x, pos, cache, layer, probe)
        if probe is not None:
            probe.on_residual(self.config.n_layers, x)
        x = self.output_norm(x if all_logits else x[:, -1])
        return self.output(x).float()
