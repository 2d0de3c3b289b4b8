"""The LLaMA-family transformer, top-down, with module names that match the GGUF tensor names.

`Transformer.forward` takes the tokens of a whole engine step flattened into `[N]` —
a decode token for each running sequence and chunks of prompt for newcomers — with a
`BatchPlan` saying which sequence, cache slot and position each token is, and a
`SlotCache` holding every sequence's keys and values. Projections and the feed-forward
run on all N tokens at once; attention runs per group of the plan. `ForwardProbe`s, when
given, watch single tokens for the trace's `full` level; without them the forward does
no extra work.
"""

from __future__ import annotations

from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.batch import AttentionGroup, BatchPlan
from inference.config import ModelConfig
from inference.kv_cache import SlotCache


class ForwardProbe(Protocol):
    """Watches one token of a forward pass (see `inference.probe`)."""

    def on_residual(self, layer: int, h: Tensor) -> None:
        """The residual stream [dim] entering `layer` (and, with layer == n_layers, leaving the last one)."""

    def on_attention(self, layer: int, q: Tensor, k: Tensor) -> None:
        """The token's queries [H, hd] and every key it may see [KV, S, hd]."""


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x / rms(x) * weight, in one fused op (which accumulates in float32 for bfloat16 inputs)."""
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rope_frequencies(config: ModelConfig, device: torch.device) -> Tensor:
    """Complex rotations [context_length, rope_dim / 2] for every position."""
    half = config.rope_dim // 2
    inv_freq = 1.0 / (config.rope_base ** (torch.arange(0, half, dtype=torch.float64, device=device) * 2 / config.rope_dim))
    angles = torch.outer(torch.arange(config.context_length, dtype=torch.float64, device=device), inv_freq)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def apply_rope(x: Tensor, freqs: Tensor) -> Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]): llama.cpp's converter permuted Q and K for this layout.

    x: [N, H, hd]; freqs: [N, rope_dim / 2].
    """
    rot = freqs.shape[-1] * 2
    pairs = x[..., :rot].float().reshape(*x.shape[:-1], -1, 2)  # [N, H, rot/2, 2]
    rotated = torch.view_as_complex(pairs) * freqs[:, None, :]  # [N, H, rot/2]
    out = torch.view_as_real(rotated).flatten(-2)  # [N, H, rot]
    if rot == x.shape[-1]:
        return out.to(x.dtype)
    return torch.cat([out.to(x.dtype), x[..., rot:]], dim=-1)


Probes = dict[int, ForwardProbe]  # token index in the flattened batch -> its probe


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
        self.qkv_weight: Tensor  # set by fuse_projections
        self.gate_up_weight: Tensor

    def fuse_projections(self) -> None:
        """One matmul for Q, K and V and one for gate and up, instead of five: the separate weights become views
        of the fused ones, so the checkpoint's names (and state_dict) stay as they are and no memory is doubled."""
        self.qkv_weight = _fuse(self.attn_q, self.attn_k, self.attn_v)
        self.gate_up_weight = _fuse(self.ffn_gate, self.ffn_up)

    def forward(self, x: Tensor, plan: BatchPlan, cache: SlotCache, layer: int, probes: Probes) -> Tensor:
        h = x + self.attention(self.attn_norm(x), plan, cache, layer, probes)
        return h + self.feed_forward(self.ffn_norm(h))

    def attention(self, x: Tensor, plan: BatchPlan, cache: SlotCache, layer: int, probes: Probes) -> Tensor:
        """Grouped-query attention over the cache: 9 query heads share 3 key/value heads in SmolLM2."""
        c = self.config
        N = x.shape[0]
        qkv = F.linear(x, self.qkv_weight).view(N, c.n_heads + 2 * c.n_kv_heads, c.head_dim)  # [N, H + 2 KV, hd]
        qk = apply_rope(qkv[:, : c.n_heads + c.n_kv_heads], plan.freqs)  # [N, H + KV, hd]: one rotation for both
        q, k, v = qk[:, : c.n_heads], qk[:, c.n_heads :], qkv[:, c.n_heads + c.n_kv_heads :]  # [N, H | KV | KV, hd]
        cache.write(layer, plan.token_slots, plan.token_positions, k, v)
        for token, probe in probes.items():
            keys, _ = cache.view(layer, int(plan.token_slots[token]), int(plan.token_slots[token]) + 1, int(plan.token_positions[token]) + 1)
            probe.on_attention(layer, q[token], keys[0])
        out = q.new_empty(N, c.n_heads, c.head_dim)  # [N, H, hd]
        for group in plan.groups:
            _attend_group(q, cache, layer, group, out, c.kv_group_size)
        return self.attn_output(out.view(N, c.n_heads * c.head_dim))  # [N, dim]

    def feed_forward(self, x: Tensor) -> Tensor:
        """SwiGLU: down(silu(gate(x)) * up(x))."""
        gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)  # [N, ffn] each
        return self.ffn_down(F.silu(gate) * up)


def _fuse(*linears: nn.Linear) -> Tensor:
    fused = torch.cat([m.weight.detach() for m in linears])  # [sum of outputs, in]
    start = 0
    for m in linears:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(fused[start : start + rows], requires_grad=False)
        start += rows
    return fused


def _attend_group(q: Tensor, cache: SlotCache, layer: int, g: AttentionGroup, out: Tensor, group_size: int) -> None:
    """One attention call for a group of the plan; writes its queries' outputs into `out` [N, H, hd]."""
    keys, values = cache.view(layer, g.lo, g.hi, g.kv_len)  # [b, KV, S, hd]
    b, t = g.q_index.shape
    n_kv, hd = keys.shape[1], keys.shape[3]
    qg = q[: b * t].view(b, t, *q.shape[1:]) if g.in_order else q[g.q_index]  # [b, t, H, hd]
    if t == 1:
        # Decode rows: fold each KV head's query heads into rows, so every cached key is read once.
        folded = qg.view(b, n_kv, group_size, hd)  # [b, KV, group, hd]
        y = F.scaled_dot_product_attention(folded, keys, values, attn_mask=g.mask).view(b, n_kv * group_size, hd)  # [b, H, hd]
    else:
        y = F.scaled_dot_product_attention(
            qg.transpose(1, 2), keys, values, attn_mask=g.mask, is_causal=g.mask is None, enable_gqa=True
        )  # [b, H, t, hd]
        y = y.transpose(1, 2).reshape(b * t, n_kv * group_size, hd)  # [b * t, H, hd]
    if g.in_order:
        out[: b * t] = y
    elif g.dst is not None:
        out[g.dst] = y
    else:
        assert g.keep is not None and g.dst_index is not None
        out[g.dst_index] = y[g.keep]


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

    def fuse_projections(self) -> None:
        """See `Block.fuse_projections`; the loader calls it once the weights are in place."""
        for block in self.blk:
            cast(Block, block).fuse_projections()

    def new_cache(self, slots: int, capacity: int) -> SlotCache:
        weight = self.token_embd.weight
        return SlotCache(self.config, weight.device, weight.dtype, slots, min(capacity, self.config.context_length))

    def forward(
        self,
        tokens: Tensor,
        plan: BatchPlan,
        cache: SlotCache,
        probes: Probes | None = None,
        logits_for: Tensor | None = None,
    ) -> Tensor:
        """tokens [N] laid out by `plan`. Returns float32 logits [n, V] for the tokens `logits_for`
        (default: the last token of every chunk)."""
        probes = probes or {}
        x = self.token_embd(tokens)  # [N, dim]
        for layer, block in enumerate(self.blk):
            for token, probe in probes.items():
                probe.on_residual(layer, x[token])
            x = block(x, plan, cache, layer, probes)
        for token, probe in probes.items():
            probe.on_residual(self.config.n_layers, x[token])
        rows = plan.last_tokens if logits_for is None else logits_for
        return self.output(self.output_norm(x[rows])).float()  # [n, V]

    def rope_table(self, device: torch.device) -> Tensor:
        """The rotations for every position, on `device` (moved there once)."""
        if self.freqs_cis.device != device:
            self.freqs_cis = self.freqs_cis.to(device)
        return self.freqs_cis
